package redisdedup

import "github.com/redis/go-redis/v9"

// The hash fields of one key (see the package documentation):
//
//	s  state: "p" (in progress) or "d" (done)
//	t  token of the attempt that claimed (and, when done, completed) the key
//	h  hex SHA-256 of the payload, written at claim time
//	c  claim time, Unix milliseconds of the server clock
//	d  completion time, Unix milliseconds of the server clock
//	r  optional result stored by CompleteWithResult
//
// Every script touches exactly one key (KEYS[1]), so each runs on the node
// that owns the key's slot in a Cluster. Scripts that write after calling TIME
// rely on effect replication, the only mode since Redis 7 and the default
// since Redis 5.

// claimScript takes the lease if the key is absent.
//
//	ARGV[1] token, ARGV[2] payload hash (hex), ARGV[3] lease in ms
//
// It returns {state, stored hash, time ms, remaining ttl ms} where state is
// "new", "busy" (another token holds a live lease), "done" or "mismatch", and
// time is the completion time for done records, the claim time otherwise. A
// "done" reply has a fifth element, the stored result, when there is one.
// A claim by the token that already holds the lease (a retried command)
// extends the lease and returns "new" again.
var claimScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't', 'h', 'c', 'd', 'r')
if not v[1] then
  local now = redis.call('TIME')
  local ms = now[1] * 1000 + math.floor(now[2] / 1000)
  redis.call('HSET', KEYS[1], 's', 'p', 't', ARGV[1], 'h', ARGV[2], 'c', ms)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'new', ARGV[2], ms, tonumber(ARGV[3])}
end
if v[1] == 'd' then
  if v[3] == ARGV[2] then
    return {'done', v[3], tonumber(v[5]) or 0, redis.call('PTTL', KEYS[1]), v[6]}
  end
  return {'mismatch', v[3], tonumber(v[5]) or 0, redis.call('PTTL', KEYS[1])}
end
if v[3] ~= ARGV[2] then
  return {'mismatch', v[3], tonumber(v[4]) or 0, redis.call('PTTL', KEYS[1])}
end
if v[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'new', v[3], tonumber(v[4]) or 0, tonumber(ARGV[3])}
end
return {'busy', v[3], tonumber(v[4]) or 0, redis.call('PTTL', KEYS[1])}
`)

// refreshScript extends a lease the token holds.
//
//	ARGV[1] token, ARGV[2] lease in ms
//
// It returns 1 if the lease was extended, 0 if the token does not hold it.
var refreshScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] == 'p' and v[2] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
`)

// completeScript marks the key done under the token that holds its lease.
//
//	ARGV[1] token, ARGV[2] retention in ms, ARGV[3] "1" to store ARGV[4] as result
//
// It returns 1 if the key is done under this token (now, or by an earlier
// call with the same token), 0 if the token does not hold the key.
var completeScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[2] ~= ARGV[1] then
  return 0
end
if v[1] == 'd' then
  return 1
end
if v[1] ~= 'p' then
  return 0
end
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('HSET', KEYS[1], 's', 'd', 'd', ms)
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'r', ARGV[4])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// abandonScript deletes the key if the token holds its lease.
//
//	ARGV[1] token
//
// It returns 1 if the lease was abandoned, 0 otherwise.
var abandonScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 't')
if v[1] == 'p' and v[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`)

// inspectScript reads a key. It returns nil if the key is absent, else
// {state, hash, claim ms, done ms, remaining ttl ms, server time ms} and a
// seventh element, the stored result, when there is one.
var inspectScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 's', 'h', 'c', 'd', 'r')
if not v[1] then
  return false
end
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
return {v[1], v[2] or '', tonumber(v[3]) or 0, tonumber(v[4]) or 0, redis.call('PTTL', KEYS[1]), ms, v[5]}
`)
