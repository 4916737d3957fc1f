-- Wake-ups across replicas (the trigger function and triggers that call
-- pg_notify) are no longer part of the schema: lockstep installs them at
-- start-up when `database.notify = "auto"` and the engine supports them, so
-- a database engine without PL/pgSQL triggers or LISTEN/NOTIFY can hold the
-- same schema. A database that already ran the original migration keeps it.
SELECT 1;
