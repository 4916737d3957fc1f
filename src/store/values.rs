//! What goes into a statement and what comes out, the same for both
//! engines: bind parameters ([`Arg`]) and owned rows ([`Values`]).
//!
//! Why rows of our own rather than sqlx's: SQLite's group commit runs its
//! statements on the write connection's own SQLite API (`batch.rs`), which
//! yields no sqlx rows, and the code that reads a row (`versions.rs`,
//! `locks.rs`) should not care which path produced it. The store's
//! statements return only integers, text and NULL, so a row is a short list
//! of those, and a column read as the wrong kind is an error, never a guess.

use sqlx::{ColumnIndex, Database, Decode, Row, Type, TypeInfo, ValueRef};

/// A bind parameter of the store's statements.
#[derive(Debug, Clone)]
pub enum Arg {
    Int(i64),
    Text(String),
}

impl Arg {
    pub fn text(s: &str) -> Self {
        Arg::Text(s.to_string())
    }

    /// A duration as whole milliseconds (saturating far beyond any TTL).
    pub fn millis(d: std::time::Duration) -> Self {
        Arg::Int(i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4))
    }
}

/// Binds `args` to `sql`, `$1` to the first.
pub fn query<'q, DB>(
    sql: &'q str,
    args: &[Arg],
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    i64: for<'e> sqlx::Encode<'e, DB> + Type<DB>,
    String: for<'e> sqlx::Encode<'e, DB> + Type<DB>,
{
    let mut q = sqlx::query::<DB>(sql);
    for a in args {
        q = match a {
            Arg::Int(i) => q.bind(*i),
            Arg::Text(s) => q.bind(s.clone()),
        };
    }
    q
}

/// One column's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    /// A column of another type (named), which no reader of the store's
    /// rows may ask for: an error only if one does.
    Other(String),
}

/// One row a statement returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values(Vec<Value>);

impl Values {
    pub fn new(columns: Vec<Value>) -> Self {
        Self(columns)
    }

    /// The columns, for tests that take a row apart.
    #[cfg(test)]
    pub fn columns_mut(&mut self) -> &mut Vec<Value> {
        &mut self.0
    }

    /// Column `index` as `T`; an error when the row is shorter or the
    /// column holds another kind of value (NULL only fits an `Option`).
    pub fn get<T: FromValue>(&self, index: usize) -> Result<T, sqlx::Error> {
        let value = self
            .0
            .get(index)
            .ok_or_else(|| sqlx::Error::ColumnIndexOutOfBounds {
                index,
                len: self.0.len(),
            })?;
        T::from_value(value).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: index.to_string(),
            source: format!("expected {}, found {value:?}", T::KIND).into(),
        })
    }

    /// A sqlx row, column by column: a column of a type that decodes as
    /// `i64` is an integer, any other non-NULL one must decode as text.
    pub fn from_row<R: Row>(row: &R) -> Result<Self, sqlx::Error>
    where
        usize: ColumnIndex<R>,
        i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
        i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
        String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    {
        enum Kind {
            Null,
            Int,
            /// A 32-bit integer (a bare literal on PostgreSQL, `SELECT 1`).
            Int32,
            Text,
            Other(String),
        }
        let mut columns = Vec::with_capacity(row.len());
        for i in 0..row.len() {
            let raw = row.try_get_raw(i)?;
            let kind = if raw.is_null() {
                Kind::Null
            } else {
                let ty = raw.type_info();
                if <i64 as Type<R::Database>>::compatible(&ty) {
                    Kind::Int
                } else if <i32 as Type<R::Database>>::compatible(&ty) {
                    Kind::Int32
                } else if <String as Type<R::Database>>::compatible(&ty) {
                    Kind::Text
                } else {
                    Kind::Other(ty.name().to_string())
                }
            };
            columns.push(match kind {
                Kind::Null => Value::Null,
                Kind::Int => Value::Int(row.try_get(i)?),
                Kind::Int32 => Value::Int(row.try_get::<i32, _>(i)?.into()),
                Kind::Text => Value::Text(row.try_get(i)?),
                Kind::Other(name) => Value::Other(name),
            });
        }
        Ok(Self(columns))
    }
}

/// A Rust type a column may be read as.
pub trait FromValue: Sized {
    /// What the column must hold, for the error when it does not.
    const KIND: &'static str;
    fn from_value(value: &Value) -> Option<Self>;
}

impl FromValue for i64 {
    const KIND: &'static str = "an integer";
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
}

impl FromValue for String {
    const KIND: &'static str = "text";
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Text(s) => Some(s.clone()),
            _ => None,
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    const KIND: &'static str = T::KIND;
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Null => Some(None),
            other => T::from_value(other).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn columns_read_as_their_kind_and_only_as_it() {
        let row = Values::new(vec![Value::Int(7), Value::Text("a".into()), Value::Null]);
        assert_eq!(row.get::<i64>(0).unwrap(), 7);
        assert_eq!(row.get::<Option<i64>>(0).unwrap(), Some(7));
        assert_eq!(row.get::<String>(1).unwrap(), "a");
        assert_eq!(row.get::<Option<String>>(2).unwrap(), None);
        assert!(row.get::<i64>(1).is_err());
        assert!(row.get::<String>(0).is_err());
        assert!(row.get::<i64>(2).is_err(), "NULL is not an integer");
        assert!(matches!(
            row.get::<i64>(3),
            Err(sqlx::Error::ColumnIndexOutOfBounds { index: 3, len: 3 })
        ));
    }

    #[tokio::test]
    async fn a_sqlx_row_keeps_its_integers_text_and_nulls() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let row = sqlx::query("SELECT 42, 'x', NULL, CAST(9 AS INTEGER), 1.5")
            .fetch_one(&pool)
            .await
            .unwrap();
        let values = Values::from_row(&row).unwrap();
        assert_eq!(
            values,
            Values::new(vec![
                Value::Int(42),
                Value::Text("x".into()),
                Value::Null,
                Value::Int(9),
                Value::Other("REAL".into()),
            ])
        );
        assert!(values.get::<Option<i64>>(4).is_err());
    }
}
