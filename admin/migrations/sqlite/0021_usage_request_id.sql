-- The gateway request id of each usage record (issue 27, traceability): the `x-request-id`
-- the client got (its own when well-formed, else ours; one per WebSocket turn), so an
-- operator finds a request by the id a client reports. NULL for records from before.

ALTER TABLE usage_records ADD COLUMN request_id TEXT;

CREATE INDEX usage_records_request_id ON usage_records (request_id);
