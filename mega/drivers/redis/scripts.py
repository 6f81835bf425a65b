"""The redis driver's key names and Lua scripts.

Every key of one job lane carries the lane's hash tag (`{<subject>}`), and every key of the
events side the tag `{events}`: on a Redis Cluster the tag alone picks a key's slot, so each
script and transaction finds all its keys on one master (a script's keys must share a slot),
while the lanes of different Job classes spread over the masters. On one server the braces are
only part of the names. (Before the tags, the keys were the same without the braces, e.g.
`mega:jobs:<subject>` and `mega:events`: data written then is not read under the new names.)

Keys of a job lane, under `mega:jobs:{<subject>}`:
    <key>             the stream; one consumer group `mega_workers` shared by every worker
    <key>:scheduled   sorted set of delayed jobs and retries (score: due epoch ms; member: the
                      entry's fields as a JSON list [name, value, name, value, ...])
    <key>:dlq         the dead-letter stream (one field `record`, capped at DLQ_MAXLEN)
    <key>:dlq:ids     hash: job id -> entry id of its newest record (`Bus.dead_letter`)
    <key>:dedup:<id>  a caller-given id seen within DEDUP_WINDOW_S (SET NX with a TTL)
    <key>:fair:...    a fair or prioritized lane's waiting jobs (see FAIR_PUSH below)
    <key>:status:<id>, <key>:result:<id>
                      the lane's records: a string per job id, expiring the lane's keep after
                      its last write (SET PX, with NX for a create)
    <key>:workers:<worker>, <key>:workers
                      the consume loops' presence records, and their index (sorted set of
                      the keys scored by expiry ms, for `list_records`)

Keys of the events and of a listener group lane, all under the tag `{events}`:
    mega:{events}                  the log: every event, trimmed to `max_age_s` (XADD MINID);
                                   one consumer group `mega_group_<group>` per listener group,
                                   made at the log's start, so a new group replays what is kept
    mega:{events}:dedup:<id>       an event id seen within DEDUP_WINDOW_S (SET NX with a TTL)
    mega:{events}:group:<group>    the group's own stream: its retries and requeued records
    ...:scheduled, ...:dlq, ...:dlq:ids   the group's retries waiting for their time, its
                                   dead letters and their index by event id
    ...:status:<id>, ...:result:<id>   its records, as a job lane's
    channel mega:outbox:wake       a commit with outbox rows, announced to relays elsewhere

An entry's fields: `id`, `body` (the JSON payload), `enqueued_at` and `run_at` (epoch ms),
`base` (attempts made before this entry: 0, or a retry's attempt number; absent on the events
log), and on the events side `subject` (`events.<event name>`, as NATS subjects are named).
"""

from __future__ import annotations

JOB_KEY_PREFIX = "mega:jobs:"  # + `{<subject>}`: a job lane's stream, the prefix of its keys
JOB_GROUP = "mega_workers"  # the consumer group of a job's stream, shared by every worker
EVENTS_LOG = "mega:{events}"  # the log, and the prefix of every key of the events side
GROUP_PREFIX = "mega_group_"  # + group: a listener group's consumer group on the log
WAKE_CHANNEL = "mega:outbox:wake"
# The `subject` field of an event entry is `events.<name>` (what the first redis driver wrote,
# after the NATS subjects); Message.subject and Delivery.subject carry the bare name.
EVENT_SUBJECT_PREFIX = "events."

# Dead letters kept per lane (oldest trimmed first); NATS keeps them by age instead.
DLQ_MAXLEN = 100_000
# How long one XREADGROUP waits for entries, and how often the promoter and the reclaimer run.
BLOCK_MS = 200
HOUSEKEEPING_S = 0.1
# Due retries moved into the stream by one PROMOTE call at most.
PROMOTE_BATCH = 1000

# KEYS: stream, scheduled, then the dedup key when the id is to be deduplicated; ARGV: id, body,
# enqueued_at, run_at, due (or ""), dedup ttl s, trace context JSON (or ""), then the flow key
# when there is one. Returns 0 when the id was a duplicate.
ENQUEUE = """
if KEYS[3] then
  if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[6]) then return 0 end
end
local fields = {'id', ARGV[1], 'body', ARGV[2], 'enqueued_at', ARGV[3], 'run_at', ARGV[4],
                'base', '0'}
if ARGV[7] ~= '' then
  table.insert(fields, 'trace')
  table.insert(fields, ARGV[7])
end
if ARGV[8] then
  table.insert(fields, 'flow_key')
  table.insert(fields, ARGV[8])
end
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[5], cjson.encode(fields))
else
  redis.call('XADD', KEYS[1], '*', unpack(fields))
end
return 1
"""

# KEYS: stream, scheduled; ARGV: now ms, max members. Moves every due member into the stream.
PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, member in ipairs(due) do
  redis.call('XADD', KEYS[1], '*', unpack(cjson.decode(member)))
  redis.call('ZREM', KEYS[2], member)
end
return #due
"""

# A fair lane (Lane.fair) keeps its jobs out of the stream until their key's turn: a list per
# key (`<stream>:fair:key:<key>`, members as the sorted set's: fields as JSON), the keys that
# have some in turn order (`<stream>:fair:turns`), and how many wait in all
# (`<stream>:fair:count`). FEED tops the stream up to `window` entries not yet delivered (its
# length less the group's pending ones), a job of each key in turn: a read feeds up to what it
# is about to read, so the stream holds few jobs and they are in turns. A push feeds up to one,
# so that a read blocked on the stream wakes for a fair job. Shared by FAIR_PUSH and FAIR_FEED.
# A prioritized lane (Lane.prioritized) is the same with a list per band (`...:key:high`),
# taken in the bands' turns (`order`: PRIORITY_TURNS as initials, "hnhh..."; "" on a fair
# lane), its `turns` key holding the count of turns taken instead of a list of keys.
# KEYS: turns, stream, count; ARGV (from `at`): window, the lists' key prefix, group, order.
_FEED = """
local bands = {h = 'high', n = 'normal', l = 'low'}

local function band_feed(turns, stream, window, prefix, order, moved)
  local turn = tonumber(redis.call('GET', turns) or '0')
  while moved < window do
    local at = turn % #order + 1
    local member = redis.call('LPOP', prefix .. bands[string.sub(order, at, at)])
      or redis.call('LPOP', prefix .. 'high') or redis.call('LPOP', prefix .. 'normal')
      or redis.call('LPOP', prefix .. 'low')
    if not member then break end
    redis.call('XADD', stream, '*', unpack(cjson.decode(member)))
    turn = turn + 1
    moved = moved + 1
  end
  redis.call('SET', turns, turn)
  return moved
end

local function feed(turns, stream, count, window, prefix, group, order)
  local waiting = redis.call('XLEN', stream) - redis.call('XPENDING', stream, group)[1]
  local moved = 0
  if order ~= '' then
    moved = band_feed(turns, stream, window - waiting, prefix, order, 0)
  end
  while order == '' and waiting + moved < window do
    local key = redis.call('LPOP', turns)
    if not key then break end
    local list = prefix .. key
    -- the only key with jobs takes all the room at once
    local take = 1
    if redis.call('LLEN', turns) == 0 then take = window - waiting - moved end
    local members = redis.call('LPOP', list, take)
    if members then
      for _, member in ipairs(members) do
        redis.call('XADD', stream, '*', unpack(cjson.decode(member)))
      end
      moved = moved + #members
    end
    if redis.call('LLEN', list) > 0 then redis.call('RPUSH', turns, key) end
  end
  if moved > 0 then redis.call('DECRBY', count, moved) end
  return moved
end
"""

# KEYS: the key's list, turns, count, stream, then the dedup key when the id is to be
# deduplicated; ARGV: the key, member, dedup ttl s, the lists' prefix, group, order. Returns 0
# when the id was a duplicate.
FAIR_PUSH = (
    _FEED
    + """
if KEYS[5] then
  if not redis.call('SET', KEYS[5], '1', 'NX', 'EX', ARGV[3]) then return 0 end
end
if redis.call('RPUSH', KEYS[1], ARGV[2]) == 1 and ARGV[6] == '' then
  redis.call('RPUSH', KEYS[2], ARGV[1])
end
redis.call('INCR', KEYS[3])
feed(KEYS[2], KEYS[4], KEYS[3], 1, ARGV[4], ARGV[5], ARGV[6])
return 1
"""
)

# KEYS: turns, stream, count; ARGV: window, the lists' prefix, group, order. Returns how many
# moved.
FAIR_FEED = (
    _FEED
    + """
return feed(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4])
"""
)

# KEYS: stream, scheduled; ARGV: entry id, due ms, fields as JSON, group, delete (1|0).
# Ack (and delete, unless other groups read the stream too) + move to the zset.
RETRY = """
redis.call('XACK', KEYS[1], ARGV[4], ARGV[1])
if ARGV[5] == '1' then redis.call('XDEL', KEYS[1], ARGV[1]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

# KEYS: stream, dlq, dlq index; ARGV: entry id, record JSON, dlq maxlen, group, delete (1|0),
# job id. Record (indexed by its job id), ack and delete at once. At the cap the oldest record
# goes, one per new one, with its index entry (unless a newer record of its id has it).
BURY = """
while redis.call('XLEN', KEYS[2]) >= tonumber(ARGV[3]) do
  local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  local ok, old = pcall(cjson.decode, oldest[2][2])
  if ok and type(old) == 'table' and old['id'] and
      redis.call('HGET', KEYS[3], old['id']) == oldest[1] then
    redis.call('HDEL', KEYS[3], old['id'])
  end
  redis.call('XDEL', KEYS[2], oldest[1])
end
local id = redis.call('XADD', KEYS[2], '*', 'record', ARGV[2])
redis.call('HSET', KEYS[3], ARGV[6], id)
redis.call('XACK', KEYS[1], ARGV[4], ARGV[1])
if ARGV[5] == '1' then redis.call('XDEL', KEYS[1], ARGV[1]) end
return 1
"""

# KEYS: dlq, dlq index; ARGV: entry id, job id. Delete one record, and its index entry when it
# points at that record. Returns how many records were deleted.
DROP = """
local deleted = redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[2], ARGV[2]) end
return deleted
"""

# KEYS: dlq, dlq index, the lane's own stream; ARGV: entry id, job id, then the fields of the
# job's new entry: a dead letter requeued, its new entry and DROP in one step.
REQUEUE = "redis.call('XADD', KEYS[3], '*', unpack(ARGV, 3))\n" + DROP

# KEYS: log, dedup key; ARGV: id, subject, body, emitted at ms, oldest id kept (ms), dedup ttl s,
# trace context JSON (or ""). Returns 0 when the id was a duplicate.
EMIT = """
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[6]) then return 0 end
local fields = {'id', ARGV[1], 'subject', ARGV[2], 'body', ARGV[3], 'enqueued_at', ARGV[4],
                'run_at', ARGV[4]}
if ARGV[7] ~= '' then
  table.insert(fields, 'trace')
  table.insert(fields, ARGV[7])
end
redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[5], '*', unpack(fields))
return 1
"""
