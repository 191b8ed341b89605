-- A queue option the broker does not act on is refused with a 400 that names it, rather than kept
-- and echoed, so the column that kept such options goes. Nothing ever acted on what it held.
ALTER TABLE queen.queues DROP COLUMN unknown_options;
