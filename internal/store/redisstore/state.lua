-- The stored forms of the decide library (after tiers.lua): hit logs as
-- records of big-endian doubles, policies decoded from their compact form
-- (encode.go), tiers, global, token bucket and fixed-window states decoded
-- and encoded (inspect.go reads the same layouts), and a state loaded from
-- and saved to its key with its expiry.


-- A stored log is its hits (l[SUM]) and its number of buckets m in the
-- state's header, and its buckets in the state's body: m records of 16
-- bytes (start, count: big-endian doubles), oldest first. The one-tier path
-- cuts and appends to the records without reading those between; ldec and
-- lbytes convert them to and from the table form.
local REC = 16

-- The struct format of k doubles, made once per k (k <= twice the buckets
-- a log holds, a state's header, or a reply of up to 64 items).
local FMT = {}
local function fmt(k)
  local f = FMT[k]
  if not f then
    f = '>' .. srep('d', k)
    FMT[k] = f
  end
  return f
end

-- bytes: the log's records and their number.
local function lbytes(l)
  local h, e = l[H], l[E]
  if e < h then return '', 0 end
  return spack(fmt(2 * (e - h + 1)), tunpack(l, 2 * h + 2, 2 * e + 3)), e - h + 1
end

-- dec: the log of m records at byte off of v with hits sum, and the byte
-- after them. The value sunpack returns after the records (its position)
-- lands past them, where entries are garbage.
local function ldec(v, off, m, sum)
  if m < 1 then return newlog(), off end
  return { 1, m, sum, sunpack(fmt(2 * m), v, off) }, off + REC * m
end

-- ---------------------------------------------------------------------------
-- Policies and states.

local function decpol(s)
  local v = munpack(s)
  local p = { kind = v[1] }
  -- od: post-paid counting (the form's last integer, 1, after the kind's).
  if p.kind == 0 then
    p.hard, p.glob, p.hw, p.gw, p.n = v[2], v[3], v[4], v[5], v[6]
    p.T = {}
    local q = 7
    for i = 1, p.n do
      p.T[i] = { lim = v[q], win = v[q + 1], act = v[q + 2], cool = v[q + 3], skip = v[q + 4] == 1, width = v[q + 5] }
      q = q + 6
    end
    -- The form's last integer: 1 post-paid, 2 a concurrency limit.
    p.od, p.conc = v[q] == 1, v[q] == 2
    -- One tier, no hard or global limit: the one-tier path (one1) can
    -- decide its grants (a post-paid one's too: a grant is decided and
    -- counted as under admission, and a state in debt grants nothing).
    p.one = p.n == 1 and p.hard == 0 and p.glob == 0
  elseif p.kind == 1 then
    p.unit, p.r, p.capU, p.cap = v[2], v[3], v[4], v[5]
    p.od = v[6] == 1
  elseif p.kind == 2 then
    p.lim, p.len = v[2], v[3]
    p.od = v[4] == 1
  elseif p.kind == 4 then
    p.lim, p.od, p.b = v[2], v[3] == 1, {}
    for i = 4, #v do p.b[i - 3] = v[i] end
  end
  return p
end

-- Decoded policies by their encoding, kept across calls (a policy is the
-- same from call to call; its table is never written). Emptied when it
-- holds maxpols of them, so the policies of old configs do not pile up.
-- A cache of a pure function of the call's arguments: it changes no
-- decision, and replicas, which apply the calls' effects, never need it.
local pcache, npols, maxpols = {}, 0, 4096

local function policy(arg)
  local p = pcache[arg]
  if p then return p end
  p = decpol(arg)
  if npols >= maxpols then pcache, npols = {}, 0 end
  pcache[arg], npols = p, npols + 1
  return p
end

-- A state blob of a kind with hit logs is one string of big-endian
-- doubles, a header then the logs' records (no msgpack: a call copies a
-- state's bytes as few times as it can, each copy of a string costing Redis
-- a pass over its bytes):
--   tiers:  5, n, second log's hits, m, then per tier: in (0/1), entered,
--           hits, m; then the second log's records, then each tier's
--   global: 11, hits, m, then the records
-- A token bucket state is a msgpack array: 1, used (0/1), at, val (what
-- it owes), unit (3: a closed policy's, without unit); a fixed window's is
-- its count (see fixed1), or an array of that form without unit. A blob of
-- another layout or kind reads as a zero state (msgpack tiers and global
-- states, tags 0, 4, 9 and 10, were earlier layouts, as is a bucket's
-- array without its unit).
local RAW = { [0] = 5, [9] = 11 }

-- raw: the blob if it is a state of that tag, else nil.
local function raw(blob, tag)
  if blob and sbyte(blob, 1) == 0x40 and #blob >= 8 and sunpack('>d', blob) == tag then return blob end
  return nil
end

-- unblob: the blob's array if it is a bucket or fixed-window state of that
-- kind, else nil (a raw state is not unpacked: it is not msgpack).
local function unblob(blob, kind)
  local v = nil
  if blob then
    local b = sbyte(blob, 1)
    if b and ((b >= 0x90 and b <= 0x9f) or b == 0xdc or b == 0xdd) then v = munpack(blob) end
  end
  if type(v) ~= 'table' or v[1] ~= kind then return nil end
  return v
end

local function newstate(kind)
  -- Every field in the constructor: no table grows afterwards.
  return { kind = kind, dirty = false, p = false, t = false, nt = 0, sec = false, log = false,
           used = false, at = 0, val = 0, unit = 0, ahead = 0, room = 0 }
end

-- decraw: the tiers or global state of v (raw's answer).
local function decraw(v, kind)
  local s = newstate(kind)
  if kind == 9 then
    if v then
      local sum, m = sunpack('>dd', v, 9)
      s.log = ldec(v, 25, m, sum)
    else
      s.log = newlog()
    end
    return s
  end
  s.t = {}
  if not v then
    s.sec = newlog()
    return s
  end
  local nt, sum, m = sunpack('>ddd', v, 9)
  local hp, off = 33, 33 + 32 * nt
  s.sec, off = ldec(v, off, m, sum)
  s.nt = nt
  for i = 1, nt do
    local inn, ent, hits
    inn, ent, sum, m = sunpack('>dddd', v, hp)
    hp = hp + 32
    hits, off = ldec(v, off, m, sum)
    s.t[i] = { inn = inn == 1, ent = ent, hits = hits }
  end
  return s
end

local function decstate(blob, kind)
  if RAW[kind] then return decraw(raw(blob, RAW[kind]), kind) end
  local s, v = newstate(kind), unblob(blob, kind)
  if v and kind == 1 then
    -- A bucket's array holds its unit (5 or 7 entries).
    if #v == 5 or #v == 7 then
      s.used, s.at, s.val, s.unit, s.ahead, s.room = v[2] == 1, v[3], v[4], v[5], v[6] or 0, v[7] or 0
    end
  elseif v then
    s.used, s.at, s.val, s.ahead, s.room = v[2] == 1, v[3], v[4], v[5] or 0, v[6] or 0
  end
  return s
end

-- The array a bucket or fixed-window state is packed from, made once; its
-- entries past 4 are cleared, as cmsgpack.pack packs a table whose keys
-- are 1..n as an array of n. HV holds a tiers state's header, PS its parts.
local O, on = {}, 0
local HV, PS = {}, {}

local function encstate(s)
  if s.kind == 9 then
    local b, m = lbytes(s.log)
    return spack('>ddd', 11, s.log[SUM], m) .. b
  end
  if s.kind == 2 and s.ahead == 0 then return sfmt('%d', s.val) end
  if s.kind ~= 0 then
    -- Pacing's two numbers (tiers.lua) follow when either is set.
    local o, n = O, 4
    o[1], o[2], o[3], o[4] = s.kind, s.used and 1 or 0, s.at, s.val
    if s.kind == 1 then o[5], n = s.unit, 5 end
    if s.ahead ~= 0 or s.room ~= 0 then o[n + 1], o[n + 2], n = s.ahead, s.room, n + 2 end
    for i = n + 1, on do o[i] = nil end
    on = n
    return mpack(o)
  end
  -- Tiers never entered after the last entered one are not written: they
  -- read back as never entered, which is what they are.
  local nt = 0
  for i = 1, s.nt do
    if s.t[i].inn then nt = i end
  end
  local b, m = lbytes(s.sec)
  HV[1], HV[2], HV[3], HV[4] = 5, nt, s.sec[SUM], m
  PS[2] = b
  for i = 1, nt do
    local ts = s.t[i]
    b, m = lbytes(ts.hits)
    HV[4 * i + 1], HV[4 * i + 2], HV[4 * i + 3], HV[4 * i + 4] = ts.inn and 1 or 0, ts.ent, ts.hits[SUM], m
    PS[i + 2] = b
  end
  PS[1] = spack(fmt(4 + 4 * nt), tunpack(HV, 1, 4 + 4 * nt))
  return table.concat(PS, '', 1, nt + 2)
end

-- A fixed window's state is its count, a decimal integer, at a key that
-- expires at the end of the count's window, or sooner when maxTTL from the
-- write that set the expiry is sooner: so the count is that of the window
-- starting at start exactly when the key's expiry (ms) is after start. A
-- key alive at t is of the current window once t is 2 ms or more into a
-- window whose length is whole ms on Redis's clock (an expiry at or before
-- start would have deleted it: Redis checks expiry at the call's start, and
-- the call reads TIME first), so its expiry is read (PEXPIRETIME) only in a
-- window's first 2 ms, for other lengths, or under the caller's clock.
-- Counts are updated in place (INCRBY): a call writes no state string and
-- its expiry only when the count starts a window. NOW and CALLER are the
-- call's instant and whether it is the caller's.
local NOW, CALLER = 0, false

-- cwin: the start of the window of the live count at key: start, that of
-- the window containing t, nil when the count is of an earlier window, or
-- a later window's when time went back (its expiry is past start + len:
-- the window that holds the instant before its expiry, whose end the
-- expiry is).
local function cwin(key, start, len, t)
  if not CALLER and fmod(len, 1000) == 0 and t - start >= 2000 then return start end
  local e = redis.call('PEXPIRETIME', key) * 1000
  if e <= start then return nil end
  if e > start + len then return floormul(e - 1, len) end
  return start
end

-- fexp: the expiry (ms) save gives a count of the window starting at start.
local function fexp(start, len, t, maxttl)
  return min(ceildiv(start + len, 1000), floormul(t, 1000) / 1000 + maxttl)
end

-- save: write state s at key, expiring at its ForgetAt, at most maxttl
-- (ms) from now.
local function save(key, s, now, maxttl)
  -- ForgetAt nil (zero): the state is equivalent to a fresh one but for
  -- the Burst flag of the next request (a first tier active for ever stays
  -- entered); it expires at now, which on Redis's clock deletes it at once,
  -- and under a caller's clock keeps the flag exact while that clock is
  -- ahead of Redis's.
  if s.kind == 2 and s.val <= 0 and s.ahead <= 0 then
    -- A count of 0 is no count: fixed1 reads a key it creates as one.
    redis.call('DEL', key)
    return
  end
  local at = forget(s.p, s) or now
  local ms = floormul(now, 1000) / 1000 + maxttl
  if at ~= INF then ms = min(ceildiv(at, 1000), ms) end
  redis.call('SET', key, encstate(s), 'PXAT', sfmt('%d', ms))
end

-- statekind: the kind of the state a policy p keeps (decstate's kind).
local function statekind(p)
  if p.kind == 4 then return 4 end
  if p.kind > 2 then return 3 end
  return p.kind
end

-- load: the state at key for a policy p (kind 9: a global state); a fixed
-- window's count is of the window cwin finds at NOW.
local function load(key, p, kind)
  local blob = redis.call('GET', key)
  local s
  local c = kind == 2 and blob and tonumber(blob)
  if c then
    s = newstate(2)
    local at = cwin(key, floormul(NOW, p.len), p.len, NOW)
    if at then s.used, s.at, s.val = true, at, c end
  else
    s = decstate(blob, kind)
  end
  s.p = p
  return s
end

