-- Example questions over the Parquet files of `runstate export`, in DuckDB's SQL.
--
-- The queries read two views, `transitions` and `rejections`, over the export folder's
-- files; query.py creates them (`python examples/analytics/query.py EXPORT_DIR`), or
-- paste the two CREATE VIEW statements below into the duckdb shell, the folder's
-- path in place of EXPORT_DIR.
--
--   CREATE VIEW transitions AS
--     SELECT * FROM read_parquet('EXPORT_DIR/transitions-*.parquet')
--     QUALIFY row_number() OVER (PARTITION BY transition_id, at_ms ORDER BY "offset") = 1;
--   CREATE VIEW rejections AS
--     SELECT * FROM read_parquet('EXPORT_DIR/rejections-*.parquet')
--     QUALIFY row_number() OVER (PARTITION BY "partition", "offset") = 1;
--
-- The views keep one row per record: an export stopped after writing its files and
-- before saving its offsets writes the same records again next time (same partition and
-- offset), and the Faust runtime may publish a transition twice (same transition_id,
-- at_ms and content, another offset). transition_id alone is not unique for ever: a
-- run forgotten by retention may be created again, from revision 0.
--
-- A run's records are all in one partition, in commit order, so within a run "offset"
-- is the order of its transitions; a transition with from_state NULL (the create)
-- starts a new life of the run id.
--
-- Each query starts with a `-- name:` line; query.py runs them by name.

-- name: time_in_state
-- How long runs stay in a state, per machine and state: a visit starts with the
-- transition that enters the state and ends with the run's next transition to another
-- state (steps and facts that keep the state do not end it). Visits still open (the
-- run is still there, or the state is terminal) have no end yet and are not counted.
WITH ordered AS (
  SELECT *,
         sum(CASE WHEN from_state IS NULL THEN 1 ELSE 0 END)
           OVER (PARTITION BY run_id ORDER BY "offset") AS life
  FROM transitions
), moves AS (
  SELECT *, lag(to_state) OVER (PARTITION BY run_id, life ORDER BY "offset") AS state_before
  FROM ordered
), entries AS (
  SELECT run_id, life, "offset", machine, to_state AS state, at_ms AS entered_ms
  FROM moves
  WHERE state_before IS DISTINCT FROM to_state
), visits AS (
  SELECT machine, state, entered_ms,
         lead(entered_ms) OVER (PARTITION BY run_id, life ORDER BY "offset") AS left_ms
  FROM entries
)
SELECT machine,
       state,
       count(*) AS visits,
       sum(left_ms - entered_ms) AS total_ms,
       avg(left_ms - entered_ms) AS avg_ms,
       quantile_cont(left_ms - entered_ms, 0.5) AS p50_ms,
       max(left_ms - entered_ms) AS max_ms
FROM visits
WHERE left_ms IS NOT NULL
GROUP BY machine, state
ORDER BY machine, state;

-- name: failures
-- Where runs fail: the transitions into a failure state (failed; run_state's timeout),
-- by machine, the state the run failed from, the event and reason that failed it, and
-- the event of the run's transition before that one. Edit the list for your machines.
WITH ordered AS (
  SELECT *,
         lag(event) OVER (PARTITION BY run_id ORDER BY "offset") AS event_before
  FROM transitions
)
SELECT machine,
       to_state AS failed_as,
       from_state,
       event,
       reason,
       event_before,
       count(*) AS runs
FROM ordered
WHERE to_state IN ('failed', 'timeout')
GROUP BY ALL
ORDER BY runs DESC, machine, failed_as, from_state, event, reason NULLS FIRST, event_before;

-- name: refusals
-- Refusals by code and principal (who proposed: authority and source; none for a record
-- refused before its signature was known, e.g. schema_invalid, unauthenticated), with
-- how many runs they touched.
SELECT code,
       principal_authority,
       principal_source,
       count(*) AS refusals,
       count(DISTINCT run_id) AS runs
FROM rejections
GROUP BY ALL
ORDER BY refusals DESC, code, principal_authority NULLS FIRST, principal_source NULLS FIRST;
