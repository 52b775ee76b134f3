-- A finished batch keeps its request counts in its own row and its lines are deleted (their
-- answers are in its output and error files, its spend in `usage_records`): the lines of
-- unfinished batches are all a key's batches hold, and they count toward its storage quota.
ALTER TABLE batches ADD COLUMN total_lines BIGINT;
ALTER TABLE batches ADD COLUMN completed_lines BIGINT;
ALTER TABLE batches ADD COLUMN failed_lines BIGINT;
UPDATE batches SET
    total_lines = (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = batches.id),
    completed_lines = (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = batches.id AND l.state = 'done' AND l.status_code = 200),
    failed_lines = (SELECT COUNT(*) FROM batch_lines l WHERE l.batch_id = batches.id AND l.state = 'done' AND l.status_code <> 200)
WHERE status IN ('completed', 'failed', 'expired', 'cancelled');
DELETE FROM batch_lines WHERE batch_id IN (SELECT id FROM batches WHERE status IN ('completed', 'failed', 'expired', 'cancelled'));
