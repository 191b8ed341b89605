-- A dead letter keeps who pushed the message (`producerSub`, the pushing token's subject with auth
-- on), so a listing shows it and a re-queued message carries it again.
ALTER TABLE queen.log_dlq ADD COLUMN producer_sub text;
