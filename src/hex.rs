//! Lowercase hex text of bytes: lock owner fingerprints, drift body
//! hashes, write lease ids.
//!
//! By hand rather than through `format!("{:02x}")`: a lease id is written
//! on every versioned write, and through `fmt` it cost about 1.5% of the
//! write's instructions.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Appends `bytes` to `out` as lowercase hex, two digits a byte.
pub fn push(out: &mut String, bytes: &[u8]) {
    out.reserve(2 * bytes.len());
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// `bytes` as lowercase hex.
pub fn of(bytes: &[u8]) -> String {
    let mut out = String::new();
    push(&mut out, bytes);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_are_written_as_format_writes_them() {
        for v in [0u64, 1, 0xf, 0x10, 0xdead_beef, u64::MAX, 1 << 63] {
            assert_eq!(super::of(&v.to_be_bytes()), format!("{v:016x}"));
        }
        assert_eq!(super::of(&[]), "");
        assert_eq!(super::of(&[0x0a, 0xb0]), "0ab0");
    }
}
