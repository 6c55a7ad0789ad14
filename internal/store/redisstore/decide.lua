#!lua name=charon_@V@
-- Charon's decide function: tiers (doc.go of package tiers) and store.Apply
-- over the items of one call, for the keys of one Redis Cluster slot.
--
-- A Redis 7 function library: Redis runs this chunk once, at FUNCTION LOAD,
-- so the helpers below are defined once, not per call; the call is
-- FCALL charon_decide_@V@, or several calls in one FCALL charon_batch_@V@
-- (fbatch, at the end; package redisfunc puts the hash of this file in place of
-- @V@, so two versions of Charon sharing one Redis each call their own
-- code).
--
-- Every quantity is an integer below 2^53 (times in µs), so Lua's doubles
-- compute exactly what package tiers computes; Unbounded is math.huge.
-- Integer division and floor are written with math.fmod, which is exact.
--
-- KEYS: the call's state keys and global keys (KEYS[1..nk]); in the lock
-- modes, KEYS[nk+i] is the lock key of KEYS[i].
-- ARGV[1]: big-endian doubles (struct '>d', exact for integers below 2^53,
--   and read without making a table): mode, now (µs; -1: use Redis TIME),
--   maxTTL (ms), lockTTL (ms), nk, n (items), then per item: state key
--   index, global key index (0: none), policy index, hits, min, flags
--   (1 refund, 2 shadow).
-- ARGV[2]: the lock token (lock modes) or "".
-- ARGV[3..]: policies, msgpack arrays of their compact form (Go's
--   tiers.Policy.AppendCompact, which derives the widths, units and
--   lengths; Unbounded as +Inf):
--   tiers:  0, hard, global, hard width, global width, n, then per tier:
--           limit, window, active, cooldown (>= 0), skippable (0/1), width
--   bucket: 1, unit p, rate r, capacity in units, capacity
--   fixed:  2, limit, window length (µs)
--   closed: 3
--   quota:  4, limit, post-paid (0/1), then 6 period boundaries (µs)
--           around the caller's now (tiers.Quota.AppendBounds): the
--           function never computes a calendar, it picks the period
--           holding its now from this table
--   a post-paid policy's form (kinds 0 to 2) ends with one more 1
-- Modes: 1 decide; 2 decide unless a key is locked; 3 prepare (lock the
-- keys, decide without writing); 4 finish and commit; 5 finish and abort
-- (refunds and post-paid debits only); 6 release the locks; 7 seal: extend the locks to lockTTL
-- if the token still holds them all (before a commit).
-- Mode 8 undo (undo, below): per item, give back the hits (ARGV's hits)
-- a mode 2 call granted to the item's group at now (the instant that call
-- answered; lockTTL 1 when that now was the caller's), no lock keys;
-- flags 4: that grant entered the tier (Burst).
-- Reply: big-endian doubles: status (0 done, 1 a key is locked, 2 a lock
-- was lost), now (µs), then per item: flags (1 OK, 2 Burst, 4
-- LimitedByHard, 8 LimitedByGlobal), Granted, Tier, TierHits, DomainHits,
-- ResourceHits, Remaining, RetryAfter (µs), ResetAfter (µs; +Inf for
-- Unbounded).

local INF = 1 / 0 -- math.huge
local SEC = 1000000
local MAXC = 1125899906842624 -- 2^50, the clamp of copies and min
local MAXCOUNT = 4503599627370496 -- 2^52, the most hits a debit counts
local DEBTB = 64 -- the live buckets a debit keeps a log within
-- Redis runs the library's chunk without the Lua libraries (math,
-- cmsgpack...): they are bound at the first call.
local fmod, mpack, munpack, spack, sunpack, tunpack, ssub, srep, sbyte, sfmt

local function min(a, b)
  if a < b then return a end
  return b
end

local function max(a, b)
  if a > b then return a end
  return b
end

-- floor(a/b)*b for b > 0 (Go: floorDiv(a, b) * b).
local function floormul(a, b)
  local r = fmod(a, b)
  if r < 0 then r = r + b end
  return a - r
end

-- Go's ceilDiv: a/b truncated, plus one when there is a remainder.
local function ceildiv(a, b)
  local r = fmod(a, b)
  local q = (a - r) / b
  if r ~= 0 then q = q + 1 end
  return q
end

-- a/b truncated, for a >= 0, b > 0.
local function idiv(a, b)
  return (a - fmod(a, b)) / b
end

local function clamp(n)
  if n < 0 then return 0 end
  if n > MAXC then return MAXC end
  return n
end

-- ---------------------------------------------------------------------------
-- Hit logs (tiers/state.go): buckets with strictly increasing starts, of
-- which l[H]..l[E] are live (bucket i's start at l[2i+2], its count at
-- l[2i+3]); l[SUM] is the hits of the live buckets. A log is one table,
-- all in its array part (made in one go by ldec, with no rehash for named
-- fields); entries outside the live buckets are garbage, never read. Same
-- operations as tiers/state.go.
local H, E, SUM = 1, 2, 3

local function newlog() return { 1, 0, 0 } end

local function lreset(l) l[H], l[E], l[SUM] = 1, 0, 0 end

-- count: hits of the buckets starting after t-w.
local function lcount(l, t, w)
  local n, lim = l[SUM], t - w
  for j = 2 * l[H] + 2, 2 * l[E] + 2, 2 do
    if l[j] > lim then break end
    n = n - l[j + 1]
  end
  return n
end

-- oldest: start of the oldest bucket counted at t, or nil.
local function loldest(l, t, w)
  local lim = t - w
  for j = 2 * l[H] + 2, 2 * l[E] + 2, 2 do
    if l[j] > lim then return l[j] end
  end
  return nil
end

-- prune: drop the buckets no longer counted at t.
local function lprune(l, t, w)
  local lim, h, e, sum = t - w, l[H], l[E], l[SUM]
  while h <= e and l[2 * h + 2] <= lim do
    sum = sum - l[2 * h + 3]
    h = h + 1
  end
  if h > e then h, e, sum = 1, 0, 0 end
  l[H], l[E], l[SUM] = h, e, sum
end

-- add: n hits at t in buckets of width b, after pruning for window w; a hit
-- at or before the newest bucket's start joins it.
local function ladd(l, t, w, b, n)
  if n <= 0 then return end
  lprune(l, t, w)
  local at = floormul(t, b)
  local e = l[E]
  l[SUM] = l[SUM] + n
  if e >= l[H] and l[2 * e + 2] >= at then
    l[2 * e + 3] = l[2 * e + 3] + n
    return
  end
  e = e + 1
  l[E], l[2 * e + 2], l[2 * e + 3] = e, at, n
end

-- debit: add's post-paid debit (tiers/state.go): within DEBTB live
-- buckets (beyond, the newest takes the hits and moves to t's bucket) and
-- a count of MAXCOUNT.
local function ldebit(l, t, w, b, n)
  lprune(l, t, w)
  n = min(n, MAXCOUNT - l[SUM])
  if n <= 0 then return end
  local e = l[E]
  if e - l[H] + 1 >= DEBTB then
    l[2 * e + 2] = max(l[2 * e + 2], floormul(t, b))
    l[2 * e + 3] = l[2 * e + 3] + n
    l[SUM] = l[SUM] + n
    return
  end
  ladd(l, t, w, b, n)
end

-- removeNewest: remove up to n hits counted at t, newest first.
local function lremove(l, t, w, n)
  lprune(l, t, w)
  local done = 0
  while done < n and l[E] >= l[H] do
    local k = 2 * l[E] + 3
    local take = min(n - done, l[k])
    l[k] = l[k] - take
    l[SUM] = l[SUM] - take
    done = done + take
    if l[k] == 0 then l[E] = l[E] - 1 end
  end
  if l[H] > l[E] then lreset(l) end
  return done
end

-- nextExpiry: the earliest instant after t at which a bucket leaves w.
local function lnext(l, t, w)
  for j = 2 * l[H] + 2, 2 * l[E] + 2, 2 do
    local x = l[j] + w
    if x > t then return x end
  end
  return nil
end

-- clears: the first instant from t at which the log counts at most lim in
-- a window of w with no hit added (tiers/state.go clearsAt).
local function lclears(l, t, w, lim)
  local n = lcount(l, t, w)
  if n <= lim then return t end
  local low = t - w
  for j = 2 * l[H] + 2, 2 * l[E] + 2, 2 do
    if l[j] > low then
      n = n - l[j + 1]
      if n <= lim then return l[j] + w end
    end
  end
  return INF
end

local function llast(l)
  if l[E] < l[H] then return nil end
  return l[2 * l[E] + 2]
end

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
    p.od = v[q] == 1
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
-- A token bucket state is a msgpack array: kind, used (0/1), at, val (3:
-- a closed policy's); a fixed window's is its count (see fixed1), or an
-- array of that form in the earlier layout. A blob of another layout or kind
-- reads as a zero state (msgpack tiers and global states, tags 0, 4, 9
-- and 10, were earlier layouts).
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
           used = false, at = 0, val = 0 }
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
  if v then s.used, s.at, s.val = v[2] == 1, v[3], v[4] end
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
  if s.kind == 2 then return sfmt('%d', s.val) end
  if s.kind ~= 0 then
    local o = O
    o[1], o[2], o[3], o[4] = s.kind, s.used and 1 or 0, s.at, s.val
    for i = 5, on do o[i] = nil end
    on = 4
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

-- A decision: the fields of tiers.Decision the Go side cannot complete.
local function newd()
  return { ok = false, granted = 0, tier = 0, th = 0, dh = 0, rh = 0, burst = false,
           lh = false, lg = false, rem = 0, retry = 0, reset = 0 }
end

-- dreset: d as newd() returns it, without a new table.
local function dreset(d)
  d.ok, d.granted, d.tier, d.th, d.dh, d.rh = false, 0, 0, 0, 0, 0
  d.burst, d.lh, d.lg, d.rem, d.retry, d.reset = false, false, false, 0, 0, 0
  return d
end

-- ---------------------------------------------------------------------------
-- Burst tiers (tiers/burst.go). s.t[i] for i <= s.nt; a tier beyond is
-- never entered. g is the global's log or nil.

-- phase: 0 inactive, 1 active, 2 cooldown.
local function phase(p, s, i, t)
  local ts = s.t[i]
  if not ts or not ts.inn then return 0 end
  local tr = p.T[i]
  local e = ts.ent + tr.act
  if t < e then return 1 end
  if t < e + tr.cool then return 2 end
  return 0
end

-- The walk grants hits in chunks at t over a read-only view of the state,
-- in local variables (table fields cost a lookup each): c the current
-- tier, cnt its hits, n granted, nm the number of tiers entered; tier j was
-- entered by the walk when MASK[j] == stamp. MASK is made once; each walk
-- takes a new stamp, which spares clearing it.
local MASK, stamp = {}, 0

-- start: the walk's start at t: the domain's and the resource's hits of
-- the last second, and the current tier (the highest active one, 0 when
-- none) with its count.
local function start(p, s, g, t)
  local dom, glob, c, cnt = lcount(s.sec, t, SEC), 0, 0, 0
  if g then glob = lcount(g, t, SEC) end
  for i = p.n, 1, -1 do
    if phase(p, s, i, t) == 1 then
      c, cnt = i, lcount(s.t[i].hits, t, p.T[i].win)
      break
    end
  end
  return dom, glob, c, cnt
end

-- target: the first tier above c that is inactive, passing over skippable
-- tiers in cooldown; 0 when none.
local function target(p, s, t, c)
  for j = c + 1, p.n do
    local ph = phase(p, s, j, t)
    if ph == 0 then return j end
    if ph ~= 2 or not p.T[j].skip then return 0 end
  end
  return 0
end

-- indebt: whether a post-paid state whose walk starts at (dom, glob, c,
-- cnt) is in debt (tiers/burst.go, walker.init).
local function indebt(p, dom, glob, c, cnt)
  if not p.od then return false end
  return (c >= 1 and cnt > p.T[c].lim) or (p.hard > 0 and dom > p.hard) or (p.glob > 0 and glob > p.glob)
end

-- walk: grant from (c, cnt, n, nm) until n reaches limit or nothing more
-- can be granted; returns c, cnt, n, nm and whether the hard, or the
-- global, limit stopped it. A state in debt grants nothing.
local function walk(p, s, t, dom, glob, c, cnt, n, nm, limit, st)
  local h, g, T = p.hard, p.glob, p.T
  if p.od and indebt(p, dom, glob, c, cnt) then
    return c, cnt, n, nm, h > 0 and dom > h, g > 0 and glob > g
  end
  while n < limit do
    local take = limit - n
    if h > 0 then
      if dom + n >= h then return c, cnt, n, nm, true, false end
      take = min(take, h - dom - n)
    end
    if g > 0 then
      if glob + n >= g then return c, cnt, n, nm, false, true end
      take = min(take, g - glob - n)
    end
    local room = 0
    if c >= 1 then room = T[c].lim - cnt end
    if room > 0 then
      take = min(take, room)
      cnt, n = cnt + take, n + take
    else
      local j = target(p, s, t, c)
      if j == 0 then return c, cnt, n, nm, false, false end
      c, cnt, nm = j, 0, nm + 1
      MASK[j] = st
    end
  end
  return c, cnt, n, nm, false, false
end

-- earlier: the earlier of best and x, counting x only when it is finite
-- and after t (best may be nil, x may be nil).
local function earlier(best, x, t)
  if x and x > t and x ~= INF and (best == nil or x < best) then return x end
  return best
end

-- next_event: the earliest instant after t at which the state's meaning
-- changes (an entry plus its active period, plus its cooldown, a bucket
-- leaving its window), or nil.
local function next_event(p, s, g, t)
  local best = nil
  for i = 1, min(p.n, s.nt) do
    local ts = s.t[i]
    if ts.inn then
      local tr = p.T[i]
      local e = ts.ent + tr.act
      best = earlier(best, e, t)
      best = earlier(best, e + tr.cool, t)
      best = earlier(best, lnext(ts.hits, t, tr.win), t)
    end
  end
  best = earlier(best, lnext(s.sec, t, SEC), t)
  if g then best = earlier(best, lnext(g, t, SEC), t) end
  return best
end

-- debt_end: an instant before which a post-paid state in debt at t stays
-- in debt with no traffic (tiers/burst.go, walker.debtEnd).
local function debt_end(p, s, g, t, dom, glob, c, cnt)
  local at = t
  if c >= 1 and cnt > p.T[c].lim then
    local tr = p.T[c]
    at = max(at, min(lclears(s.t[c].hits, t, tr.win, tr.lim), s.t[c].ent + tr.act))
  end
  if p.hard > 0 and dom > p.hard then at = max(at, lclears(s.sec, t, SEC, p.hard)) end
  if g and p.glob > 0 and glob > p.glob then at = max(at, lclears(g, t, SEC, p.glob)) end
  return at
end

-- retry_tiers: the wait until max(m, 1) hits would be granted, or INF.
local function retry_tiers(p, s, g, t, k, m)
  local need = max(m, 1)
  if k == 0 then need = 0 end
  if need > k or (need > 0 and p.n == 0) or (p.hard > 0 and need > p.hard) or (p.glob > 0 and need > p.glob) then
    return INF
  end
  local cur = t
  while true do
    local nx = next_event(p, s, g, cur)
    if not nx then return INF end
    cur = nx
    local dom, glob, c, cnt = start(p, s, g, cur)
    local skip = false
    if p.od and indebt(p, dom, glob, c, cnt) then
      -- No instant before the debt can end grants: go to it.
      local x = debt_end(p, s, g, cur, dom, glob, c, cnt)
      if x > cur then cur, skip = x - 1, true end
    end
    if not skip then
      stamp = stamp + 1
      local _, _, n = walk(p, s, cur, dom, glob, c, cnt, 0, 0, need, stamp)
      if n >= need and not indebt(p, dom, glob, c, cnt) then return cur - t end
    end
  end
end

-- apply_tiers: commit a walk that started at tier c0 holding cnt0 and, at
-- the request's k, granted n, ended in tier c holding cnt, having entered
-- nm tiers (those with mask[j] == stamp).
local function apply_tiers(p, s, gs, t, c0, cnt0, n, c, cnt, nm, mask, stamp)
  for i = s.nt + 1, p.n do s.t[i] = { inn = false, ent = 0, hits = newlog() } end
  if p.n > s.nt then s.nt = p.n end
  local T = p.T
  if nm == 0 then
    ladd(s.t[c0].hits, t, T[c0].win, T[c0].width, n)
  else
    -- The tier left fills up; the tiers entered are entered at t with an
    -- emptied log; the last one gets the rest.
    if c0 >= 1 then
      local x = T[c0].lim - cnt0
      if x > 0 then ladd(s.t[c0].hits, t, T[c0].win, T[c0].width, x) end
    end
    for j = c0 + 1, c do
      if mask[j] == stamp then
        local ts, tr = s.t[j], T[j]
        ts.inn, ts.ent = true, t
        lreset(ts.hits)
        local x = tr.lim
        if j == c then x = cnt end
        ladd(ts.hits, t, tr.win, tr.width, x)
      end
    end
  end
  ladd(s.sec, t, SEC, p.hw, n)
  s.dirty = true
  if gs then
    ladd(gs.log, t, SEC, p.gw, n)
    gs.dirty = true
  end
end

-- debit_tiers: a post-paid rejection's commit (tiers/burst.go,
-- debitTiers): the walk's grants as apply_tiers commits them, the rest of
-- the k hits debited to the tier it ended in and to the per-second logs.
local function debit_tiers(p, s, gs, t, c0, cnt0, n, c, cnt, nm, st, k)
  if n > 0 then apply_tiers(p, s, gs, t, c0, cnt0, n, c, cnt, nm, MASK, st) end
  local rest = k - n
  if rest <= 0 then return end
  if c >= 1 then ldebit(s.t[c].hits, t, p.T[c].win, p.T[c].width, rest) end
  ldebit(s.sec, t, SEC, p.hw, rest)
  s.dirty = true
  if gs then
    ldebit(gs.log, t, SEC, p.gw, rest)
    gs.dirty = true
  end
end

local function decide_tiers(p, s, gs, t, k, m, commit, d)
  local g = gs and gs.log
  local dom, glob, c0, cnt0 = start(p, s, g, t)
  local debt = indebt(p, dom, glob, c0, cnt0)
  stamp = stamp + 1
  local st = stamp
  -- The walk for the request's k hits...
  local c, cnt, n, nm, lh, lg = walk(p, s, t, dom, glob, c0, cnt0, 0, 0, k, st)
  d.lh, d.lg = lh, lg
  -- ... goes on for Remaining; it marks only tiers above c.
  local _, _, more = walk(p, s, t, dom, glob, c, cnt, n, nm, MAXC, st)
  if n >= m and m <= k and not debt then
    d.ok, d.granted = true, n
    d.tier, d.th = c, cnt
    d.burst = nm > 0
    d.dh = dom + n
    if g then d.rh = glob + n end
    d.rem = more - n
    if c >= 1 then
      -- ResetAfter: the oldest counted hit of the current tier (t when
      -- entered now) plus its window, minus t.
      local win = p.T[c].win
      local oldest = t
      if MASK[c] ~= st then
        local o = loldest(s.t[c].hits, t, win)
        if o then oldest = o end
      end
      d.reset = max(0, oldest + win - t)
    end
    if commit and n > 0 then apply_tiers(p, s, gs, t, c0, cnt0, n, c, cnt, nm, MASK, st) end
  else
    d.tier, d.th = c0, cnt0
    d.dh = dom
    if g then d.rh = glob end
    d.rem = more
    if p.od then
      d.rem = 0
      if commit then debit_tiers(p, s, gs, t, c0, cnt0, n, c, cnt, nm, st, k) end
    end
    d.retry = retry_tiers(p, s, g, t, k, m)
    d.reset = d.retry
  end
  return d
end

local function refund_tiers(p, s, gs, t, hits)
  local g = gs and gs.log
  local _, _, c = start(p, s, g, t)
  if c == 0 or hits <= 0 then return end
  local n = lremove(s.t[c].hits, t, p.T[c].win, hits)
  lremove(s.sec, t, SEC, n)
  s.dirty = true
  if gs then
    lremove(g, t, SEC, n)
    gs.dirty = true
  end
end

local function forget_tiers(p, s)
  local best = nil
  for i = 1, s.nt do
    local ts = s.t[i]
    if ts.inn and i <= p.n then
      local tr = p.T[i]
      local x = nil
      if tr.act ~= INF then
        x = ts.ent + tr.act + tr.cool
      else
        -- A tier above the first active for ever: kept for ever.
        if i > 1 then return INF end
        local at = llast(ts.hits)
        if at then x = at + tr.win end
      end
      if x and (best == nil or x > best) then best = x end
    end
  end
  local at = llast(s.sec)
  if at and (best == nil or at + SEC > best) then best = at + SEC end
  return best
end

-- ---------------------------------------------------------------------------
-- Token bucket (tiers/bucket.go): balance val in units at time at.

local function balance(p, s, t)
  if not s.used then return p.capU end
  local b = min(s.val, p.capU)
  local dt = t - s.at
  if dt <= 0 then return b end
  if dt >= ceildiv(p.capU - b, p.r) then return p.capU end
  return b + p.r * dt
end

local function decide_bucket(p, s, t, k, m, commit, d)
  local unit = p.unit
  d.tier = 1
  local b = balance(p, s, t)
  local whole = idiv(max(0, b), unit)
  local n = min(k, whole)
  if n >= m and m <= k and b >= 0 then
    b = b - n * unit
    d.ok, d.granted = true, n
    d.rem = idiv(b, unit)
    d.th = p.cap - d.rem
    if b < p.capU then d.reset = ceildiv(unit - fmod(b, unit), p.r) end
    if commit and n > 0 then
      s.used, s.val, s.at = true, b, max(s.at, t)
      s.dirty = true
    end
    return d
  end
  d.rem = whole
  if p.od then
    -- Post-paid: the k hits are debited, down to minus the capacity.
    d.rem = 0
    if commit and k > 0 then
      if k > idiv(b + p.capU, unit) then b = -p.capU else b = b - k * unit end
      s.used, s.val, s.at = true, b, max(s.at, t)
      s.dirty = true
    end
  end
  d.th = p.cap - d.rem
  local need = max(m, 1)
  if k == 0 then need = 0 end
  if need > k or need > p.cap then
    d.retry = INF
  else
    d.retry = ceildiv(need * unit - b, p.r)
  end
  d.reset = d.retry
  return d
end

local function refund_bucket(p, s, t, hits)
  if hits <= 0 then return end
  local b = balance(p, s, t)
  hits = min(hits, p.cap)
  s.used, s.val, s.at = true, min(p.capU, b + hits * p.unit), max(s.at, t)
  s.dirty = true
end

local function forget_bucket(p, s)
  if not s.used then return nil end
  if s.val >= p.capU then return s.at end
  return s.at + ceildiv(p.capU - s.val, p.r)
end

-- ---------------------------------------------------------------------------
-- Fixed window (tiers/fixed.go): count val of the window starting at at.

-- A calendar quota (kind 4) is counted as a fixed window over the periods
-- of its boundary table b: pwin is the period holding t, the first or
-- the last one of the table when t is outside it (a Redis clock more than
-- two periods from the caller's: the count then goes to a period already
-- over or not yet begun, never granting more in the period holding t).
local function pwin(p, t)
  if p.kind ~= 4 then
    local start = floormul(t, p.len)
    return start, start + p.len
  end
  local b, i = p.b, 1
  while i < #b - 1 and b[i + 1] <= t do i = i + 1 end
  return b[i], b[i + 1]
end

-- fwin: the start, count and end of the window counted at t.
local function fwin(p, s, t)
  local start, e = pwin(p, t)
  if s.used and s.at >= start then
    if s.at ~= start then start, e = pwin(p, s.at) end
    return s.at, s.val, e
  end
  return start, 0, e
end

local function decide_fixed(p, s, t, k, m, commit, d)
  local lim = p.lim
  if lim < 1 then
    -- A limit of 0 rejects every request, as tiers' closed decision.
    d.retry, d.reset = INF, INF
    return d
  end
  local start, cnt, e = fwin(p, s, t)
  d.tier = 1
  local reset = e - t
  local n = min(k, max(0, lim - cnt))
  if n >= m and m <= k and not (p.od and cnt > lim) then
    d.ok, d.granted = true, n
    d.th = cnt + n
    d.rem = max(0, lim - cnt - n)
    d.reset = reset
    if commit and n > 0 then
      s.used, s.at, s.val = true, start, cnt + n
      s.dirty = true
    end
    return d
  end
  d.th = cnt
  d.rem = max(0, lim - cnt)
  if p.od then
    -- Post-paid: the k hits are counted all the same.
    d.rem = 0
    if commit and k > 0 then
      s.used, s.at, s.val = true, start, min(cnt + k, MAXCOUNT)
      s.dirty = true
    end
  end
  local need = max(m, 1)
  if k == 0 then need = 0 end
  if need > k or need > lim then d.retry = INF else d.retry = reset end
  d.reset = d.retry
  return d
end

local function refund_fixed(p, s, t, hits)
  if hits <= 0 then return end
  local start, cnt = fwin(p, s, t)
  if not s.used or s.at ~= start then return end
  s.val = max(0, cnt - hits)
  s.dirty = true
end

local function forget_fixed(p, s)
  if not s.used or s.val <= 0 then return nil end
  local _, e = pwin(p, s.at)
  return e
end

-- ---------------------------------------------------------------------------
-- tiers.Peek / tiers.Request, tiers.Refund, tiers.ForgetAt.

-- decide: the decision on k hits, at least m, written to d (as from
-- newd); commit applies a grant to the states.
local function decide(p, s, gs, t, k, m, commit, d)
  k, m = clamp(k), clamp(m)
  if p.kind == 0 then return decide_tiers(p, s, gs, t, k, m, commit, d) end
  if p.kind == 1 then return decide_bucket(p, s, t, k, m, commit, d) end
  if p.kind == 2 or p.kind == 4 then return decide_fixed(p, s, t, k, m, commit, d) end
  -- Closed: nothing is ever granted.
  d.retry, d.reset = INF, INF
  return d
end

local function refund(p, s, gs, t, hits)
  hits = clamp(hits)
  if p.kind == 0 then refund_tiers(p, s, gs, t, hits)
  elseif p.kind == 1 then refund_bucket(p, s, t, hits)
  elseif p.kind == 2 or p.kind == 4 then refund_fixed(p, s, t, hits) end
end

local function forget(p, s)
  if s.kind == 9 then
    local at = llast(s.log)
    if at then return at + SEC end
    return nil
  end
  if p.kind == 0 then return forget_tiers(p, s) end
  if p.kind == 1 then return forget_bucket(p, s) end
  if p.kind == 2 or p.kind == 4 then return forget_fixed(p, s) end
  return nil
end

-- ---------------------------------------------------------------------------
-- The call.


-- The answer's header and one item's answer: big-endian doubles.
local function rhead(status, now) return spack('>dd', status, now) end

local function dflags(d)
  local f = 0
  if d.ok then f = f + 1 end
  if d.burst then f = f + 2 end
  if d.lh then f = f + 4 end
  if d.lg then f = f + 8 end
  return f
end

local function ritem(d, granted)
  return spack('>ddddddddd', dflags(d), granted, d.tier, d.th, d.dh, d.rh, d.rem, d.retry, d.reset)
end

-- rone: the whole answer to a call of one item, in one string.
local function rone(now, d, granted)
  return spack('>ddddddddddd', 0, now, dflags(d), granted, d.tier, d.th, d.dh, d.rh, d.rem, d.retry, d.reset)
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
  if s.kind == 2 and s.val <= 0 then
    -- A count of 0 is no count: fixed1 reads a key it creates as one.
    redis.call('DEL', key)
    return
  end
  local at = forget(s.p, s) or now
  local ms = floormul(now, 1000) / 1000 + maxttl
  if at ~= INF then ms = min(ceildiv(at, 1000), ms) end
  redis.call('SET', key, encstate(s), 'PXAT', sfmt('%d', ms))
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

-- ---------------------------------------------------------------------------
-- The one-tier path: a call of one take item (the fast path below) whose
-- policy is one tier with no hard or global limit (p.one), with no global
-- key. It grants what decide_tiers grants, with the same answer, state and
-- expiry as save's, reading the header and the records it needs of the
-- stored string v (the expired ones at each log's head, the newest) and
-- making the new state in one concatenation: no table per call, and every
-- step of the walk, apply_tiers, forget_tiers and encstate written out for
-- the one tier. A call it would not grant (a rejection, no hit granted, the
-- tier in its cooldown, a state of more tiers) is left to decide, on the
-- same string.

-- cut: the first byte of the records v[q..e] (whole records) that start
-- after lo, and the hits sum less those of the records before it (prune).
local function cut(v, q, e, sum, lo)
  while q < e do
    local at, c = sunpack('>dd', v, q)
    if at > lo then return q, sum end
    sum = sum - c
    q = q + REC
  end
  return q, 0
end

-- put: n hits added at t in buckets of width w to the records v[q..e]
-- (ladd after the prune): the records kept as they are (up to byte k), the
-- newest record to write, its start, and the number of records.
local function put(v, q, e, t, w, n)
  local at = floormul(t, w)
  if q < e then
    local last, c = sunpack('>dd', v, e - REC + 1)
    local m = (e - q + 1) / REC
    if last >= at then return e - REC, spack('>dd', last, c + n), last, m end
    return e, spack('>dd', at, n), at, m + 1
  end
  return q - 1, spack('>dd', at, n), at, 1
end

-- The writes and item replies the many path holds back until every item
-- is granted (made once; entries are overwritten, never cleared, so that
-- the tables keep their size): PK, PB, PM the key, state and expiry at a
-- slot, PW which write (fixed1), PR the reply's numbers (the header's
-- two, then nine per item: rput), packed in one string at the end.
local PK, PB, PM, PR, PW = {}, {}, {}, {}, {}

-- rput: the reply of the item at slot (the nine numbers of ritem).
local function rput(slot, f, n, tier, th, dh, rh, rem, retry, reset)
  local o = 9 * slot - 6
  PR[o], PR[o + 1], PR[o + 2], PR[o + 3], PR[o + 4] = f, n, tier, th, dh
  PR[o + 5], PR[o + 6], PR[o + 7], PR[o + 8] = rh, rem, retry, reset
end

-- one1: the whole answer, or nil and the state's string (raw's answer)
-- for decide. With slot, a grant is not written: its key, state, expiry
-- and item reply go to PK, PB, PM and PR (PW, below, notes a SET), and
-- one1 answers true. With peek, a grant is answered and not written (a
-- two-step's prepare: tiers.Peek, which answers what Request would).
local function one1(key, p, t, k, m, maxttl, slot, peek)
  local v = raw(redis.call('GET', key), 5)
  -- sq..se and tq..te: the bytes of the second log's and the tier's
  -- records (none: q > e).
  local ssum, inn, ent, cnt, sq, se, tq, te = 0, false, 0, 0, 1, 0, 1, 0
  if v then
    local nt, sm, tm, i
    nt, ssum, sm = sunpack('>ddd', v, 9)
    if nt == 1 then
      i, ent, cnt, tm = sunpack('>dddd', v, 33)
      inn, sq = i == 1, 65
    elseif nt == 0 then
      sq, tm = 33, 0
    else
      return nil, v
    end
    se = sq + REC * sm - 1
    tq, te = se + 1, se + REC * tm
  end
  k, m = clamp(k), clamp(m)
  local tr = p.T[1]
  local lim, win, act = tr.lim, tr.win, tr.act
  -- The walk (start, walk): from the tier while active, entering it (a
  -- burst) while inactive, none in its cooldown. ResetAfter: the oldest
  -- counted hit of the tier (t when entered now) plus its window, minus t.
  local burst, n, reset = true, 0, 0
  if inn then
    local x = ent + act
    if t < x then
      burst = false
    elseif t < x + tr.cool then
      return nil, v
    end
  end
  if burst then
    -- Entered at t with an emptied log.
    ent, cnt, tq = t, 0, te + 1
    n = min(k, lim)
    reset = max(0, win)
  else
    tq, cnt = cut(v, tq, te, cnt, t - win)
    local oldest = t
    if tq < te then oldest = sunpack('>d', v, tq) end
    n = min(k, lim - cnt)
    reset = max(0, oldest + win - t)
  end
  if n < 1 or n < m or m > k then return nil, v end
  cnt = cnt + n
  -- apply_tiers and encstate: the second log, then the tier, entered.
  local dom, sk, sn, sat, sm, tk, tn, tat, tm
  sq, dom = cut(v, sq, se, ssum, t - SEC)
  if peek then
    local f = 1
    if burst then f = 3 end
    return spack('>ddddddddddd', 0, t, f, n, 1, cnt, dom + n, 0, max(0, min(MAXC - n, lim - cnt)), 0, reset)
  end
  sk, sn, sat, sm = put(v, sq, se, t, p.hw, n)
  tk, tn, tat, tm = put(v, tq, te, t, tr.width, n)
  local b = spack('>dddddddd', 5, 1, dom + n, sm, 1, ent, cnt, tm)
  if v then
    b = b .. ssub(v, sq, sk) .. sn .. ssub(v, tq, tk) .. tn
  else
    b = b .. sn .. tn
  end
  -- save: forget_tiers (both logs hold a bucket now).
  local at
  if act ~= INF then at = ent + act + tr.cool else at = tat + win end
  if sat + SEC > at then at = sat + SEC end
  local ms = floormul(t, 1000) / 1000 + maxttl
  if at ~= INF then ms = min(ceildiv(at, 1000), ms) end
  local f = 1
  if burst then f = 3 end
  if slot then
    PK[slot], PW[slot], PB[slot], PM[slot] = key, 1, b, sfmt('%d', ms)
    rput(slot, f, n, 1, cnt, dom + n, 0, max(0, min(MAXC - n, lim - cnt)), 0, reset)
    return true
  end
  redis.call('SET', key, b, 'PXAT', sfmt('%d', ms))
  return spack('>ddddddddddd', 0, t, f, n, 1, cnt, dom + n, 0, max(0, min(MAXC - n, lim - cnt)), 0, reset)
end

-- The undo of the counts many increments (key, then the increment, 0 when
-- the key was created). PW is the write many holds back at a slot: 1 SET
-- PB PXAT PM (one1's, or a count that starts a window over a stale one or
-- grants less than it counted), 0 none.
local UK, UA, un = {}, {}, 0

-- fixed1: one1 for a fixed window (p.kind 2): decide_fixed's answer and
-- save's count and expiry. It counts k hits at once (INCRBY, which also
-- reads the count) and takes back what it does not grant. With slot (for
-- many), a grant's write is held at slot, the increment is noted in UK and
-- UA, and fixed1 answers true; a rejection is taken back and answers nil.
-- Without slot, it answers the whole reply, a rejection's too (a post-paid
-- policy's keeps its count: its debit). nil also
-- when the key holds no count (an earlier layout): decide reads it.
local function fixed1(key, p, t, k, m, maxttl, slot)
  local lim, len = p.lim, p.len
  k, m = clamp(k), clamp(m)
  if len <= 0 or lim < 1 or k < 1 or m > k then return nil end
  local c = redis.pcall('INCRBY', key, k)
  if type(c) ~= 'number' then return nil end
  local start, cnt, fresh = floormul(t, len), c - k, c == k
  if not fresh then
    local at = cwin(key, start, len, t)
    if at then start = at else cnt, fresh = 0, true end
  end
  local n, reset = min(k, max(0, lim - cnt)), start + len - t
  if n < 1 or n < m then
    if p.od and not slot and (n < m or cnt > lim) then
      -- A post-paid refusal keeps the hits INCRBY counted (up to MAXCOUNT),
      -- as decide_fixed's debit and save would write them.
      local v = min(cnt + k, MAXCOUNT)
      if fresh or v ~= c or len > (maxttl - 1) * 1000 then
        redis.call('SET', key, sfmt('%d', v), 'PXAT', sfmt('%d', fexp(start, len, t, maxttl)))
      end
      local retry = reset
      if max(m, 1) > lim then retry = INF end
      return spack('>ddddddddddd', 0, t, 0, 0, 1, cnt, 0, 0, 0, retry, retry)
    end
    if c == k then redis.call('DEL', key) else redis.call('DECRBY', key, k) end
    if slot then return nil end
    if n >= m then
      -- Nothing to grant and a minimum of 0: granted, 0 hits.
      return spack('>ddddddddddd', 0, t, 1, 0, 1, cnt, 0, 0, max(0, lim - cnt), 0, reset)
    end
    local retry = reset
    if max(m, 1) > lim then retry = INF end
    return spack('>ddddddddddd', 0, t, 0, 0, 1, cnt, 0, 0, max(0, lim - cnt), retry, retry)
  end
  local w, b, ms = 0, false, false
  if fresh or n < k or len > (maxttl - 1) * 1000 then
    ms = sfmt('%d', fexp(start, len, t, maxttl))
    if c == k then
      -- A key INCRBY made gets its expiry at once: no count lives without
      -- one, whatever happens to the rest of the call.
      redis.call('PEXPIREAT', key, ms)
    end
    if c ~= k or n < k then w, b = 1, sfmt('%d', cnt + n) end
  end
  if slot then
    un = un + 1
    UK[un], UA[un] = key, k
    if c == k then UA[un] = 0 end
    PK[slot], PW[slot], PB[slot], PM[slot] = key, w, b, ms
    rput(slot, 1, n, 1, cnt + n, 0, 0, max(0, lim - cnt - n), 0, reset)
    return true
  end
  if w == 1 then redis.call('SET', key, b, 'PXAT', ms) end
  return spack('>ddddddddddd', 0, t, 1, n, 1, cnt + n, 0, 0, max(0, lim - cnt - n), 0, reset)
end

-- fixed0: fixed1's answer to a grant, for a two-step's prepare (a peek):
-- the count is read (GET), not changed; nil for a rejection, or a key
-- holding no count (decide answers them).
local function fixed0(key, p, t, k, m)
  local lim, len = p.lim, p.len
  k, m = clamp(k), clamp(m)
  if len <= 0 or lim < 1 or k < 1 or m > k then return nil end
  local blob = redis.call('GET', key)
  local c = 0
  if blob then
    c = tonumber(blob)
    if not c then return nil end
  end
  local start, cnt = floormul(t, len), 0
  if c > 0 then
    local at = cwin(key, start, len, t)
    if at then start, cnt = at, c end
  end
  local n = min(k, max(0, lim - cnt))
  if n < 1 or n < m then return nil end
  return spack('>ddddddddddd', 0, t, 1, n, 1, cnt + n, 0, 0, max(0, lim - cnt - n), 0, start + len - t)
end

-- many: a call of several take items on distinct state keys whose policies
-- are one tier with no hard or global limit (Envoy's several plain
-- rate_limit descriptors) or fixed windows, when every item is granted. store.Apply's steps
-- reduce to one tiers.Request per item: no refund (step 1); each item is
-- its own group, sharing no state and no global room (step 2); every Peek
-- grants, so no group rejects the call (step 3) and each Request grants
-- what its Peek did (step 4). The grants are decided first and written
-- only when all of them are; otherwise nil, with nothing written, for the
-- general path. SEEN marks the keys of the call (with gen, its number).
local SEEN, gen = {}, 0
local function many(KEYS, ARGV, now, maxttl, n, pos)
  local ok = true
  un, gen = 0, gen + 1
  for i = 1, n do
    local sk, gk, pi, hits, mn, f
    sk, gk, pi, hits, mn, f, pos = sunpack('>dddddd', ARGV[1], pos)
    local p = nil
    if gk == 0 and fmod(f, 2) == 0 and SEEN[sk] ~= gen then p = policy(ARGV[2 + pi]) end
    SEEN[sk] = gen
    local granted = false
    if p and p.one then
      granted = one1(KEYS[sk], p, now, hits, mn, maxttl, i) == true
    elseif p and p.kind == 2 then
      granted = fixed1(KEYS[sk], p, now, hits, mn, maxttl, i) == true
    end
    if not granted then
      ok = false
      break
    end
  end
  if not ok then
    -- Take back the counts: the general path decides on the stored states.
    for j = 1, un do
      if UA[j] == 0 then redis.call('DEL', UK[j]) else redis.call('DECRBY', UK[j], UA[j]) end
    end
    return nil
  end
  for i = 1, n do
    if PW[i] == 1 then redis.call('SET', PK[i], PB[i], 'PXAT', PM[i]) end
  end
  PR[1], PR[2] = 0, now
  return spack(fmt(2 + 9 * n), tunpack(PR, 1, 2 + 9 * n))
end

local function statekind(p)
  if p.kind == 4 then return 4 end
  if p.kind > 2 then return 3 end
  return p.kind
end

-- The decision of the fast path (a call of one take item), made once.
local D = newd()

-- split: share the answer of group leader i between its members, in item
-- order: each its min, then the rest up to its hits.
local function split(i, items, lead, out, gr, gm)
  local d = out[i]
  local extra = d.granted - gm[i]
  for j = i, #items do
    local o = items[j]
    if not o.refund and lead[j] == i then
      out[j] = d
      if not d.ok then
        gr[j] = 0
      else
        local e = min(o.hits - o.min, extra)
        extra = extra - e
        gr[j] = o.min + e
      end
    end
  end
end

-- The general path: any number of items, refunds, the two-step's modes.
local function general(KEYS, ARGV, mode, now, maxttl, lockttl, nk, n, pos)
  local token = ARGV[2]
  local items, pols = {}, {}
  for i = 1, n do
    local sk, gk, pi, hits, mn, f
    sk, gk, pi, hits, mn, f, pos = sunpack('>dddddd', ARGV[1], pos)
    local it = { sk = sk, gk = gk, pi = pi, hits = hits, min = mn }
    it.refund = fmod(f, 2) == 1
    it.shadow = fmod(idiv(f, 2), 2) == 1
    if not pols[pi] then pols[pi] = policy(ARGV[2 + pi]) end
    it.p = pols[pi]
    items[i] = it
  end

  -- Load every key once; items sharing a key share its table.
  local st = {}
  for i = 1, n do
    local it = items[i]
    if not st[it.sk] then st[it.sk] = load(KEYS[it.sk], it.p, statekind(it.p)) end
    if it.gk > 0 and not st[it.gk] then st[it.gk] = load(KEYS[it.gk], nil, 9) end
  end
  local function gstate(it)
    if it.gk > 0 then return st[it.gk] end
    return nil
  end

  -- Groups: the take items sharing a state key, led by the first of them,
  -- asking for the sum of their hits and minimums (store.Apply).
  local lead, gh, gm, first = {}, {}, {}, {}
  for i = 1, n do
    local it = items[i]
    if not it.refund then
      local l = first[it.sk]
      if not l then
        l = i
        first[it.sk] = i
        gh[i], gm[i] = 0, 0
      end
      lead[i] = l
      gh[l] = gh[l] + it.hits
      gm[l] = gm[l] + it.min
    end
  end

  local out, gr = {}, {}

  -- Apply step 1: every refund, in order, then a Peek of one hit.
  for i = 1, n do
    local it = items[i]
    if it.refund then
      refund(it.p, st[it.sk], gstate(it), now, it.hits)
      local d = decide(it.p, st[it.sk], gstate(it), now, 1, 1, false, newd())
      d.ok = true
      out[i], gr[i] = d, 0
    end
  end

  -- Step 2: each group's Peek of its sums, in leader order; a global
  -- limit's room is shared with the earlier granted groups of the same
  -- global.
  local rejected = (mode == 5)
  for i = 1, n do
    local it = items[i]
    if not it.refund and lead[i] == i then
      local p = it.p
      local d = decide(p, st[it.sk], gstate(it), now, gh[i], gm[i], false, newd())
      if d.ok and it.gk > 0 and p.kind == 0 and p.glob > 0 then
        local s = 0
        for k = 1, i - 1 do
          local o = items[k]
          if o.gk == it.gk and not o.refund and lead[k] == k and out[k].ok then s = s + out[k].granted end
        end
        local room = p.glob - (d.rh - d.granted) - s
        if room < d.granted then
          if room >= gm[i] then
            d.granted = room
          else
            d.ok, d.granted, d.lg = false, 0, true
            d.rem = max(room, 0)
            -- As store.Apply: never when the minimum and the earlier
            -- groups' grants exceed the limit, else the global window.
            d.retry = SEC
            if gm[i] + s > p.glob then d.retry = INF end
            d.reset = d.retry
          end
        end
      end
      out[i] = d
      if not d.ok and not it.shadow then rejected = true end
    end
  end

  if mode == 3 then
    -- Prepare: lock the keys, write nothing, answer the predictions.
    for i = 1, nk do
      redis.call('SET', KEYS[nk + i], token, 'PX', lockttl)
    end
    for i = 1, n do
      if not items[i].refund and lead[i] == i then split(i, items, lead, out, gr, gm) end
    end
  else
    -- Step 3: a rejected non-shadow group rejects the call: predictions,
    -- but for the post-paid groups, always committed (debited).
    -- Step 4: otherwise commit every group but the rejected shadow ones
    -- that are not post-paid.
    for i = 1, n do
      local it = items[i]
      if not it.refund and lead[i] == i then
        if it.p.od or (not rejected and not (it.shadow and not out[i].ok)) then
          out[i] = decide(it.p, st[it.sk], gstate(it), now, gh[i], gm[i], true, newd())
        end
        split(i, items, lead, out, gr, gm)
      end
    end
    -- Write what changed.
    for k, s in pairs(st) do
      if s.dirty then save(KEYS[k], s, now, maxttl) end
    end
    if mode >= 4 then
      for i = 1, nk do
        if redis.call('GET', KEYS[nk + i]) == token then redis.call('DEL', KEYS[nk + i]) end
      end
    end
  end

  local r = { rhead(0, now) }
  for i = 1, n do r[i + 1] = ritem(out[i], gr[i]) end
  return table.concat(r)
end

-- single: the whole answer to a call of one take item (the common call),
-- or nil for a refund (general decides it), with the same answer and
-- writes as general's. store.Apply's steps reduce to one tiers.Request at
-- now for k = hits, m = min: there is no refund (step 1); the item is its
-- group, and no earlier group shares its global limit's room (step 2); if
-- the Peek would reject, so does the Request, which then changes nothing
-- (tiers/doc.go: "If fewer than m are granted nothing changes"), shadow or
-- not (steps 3, 4); if it would grant, the Request grants the same. The
-- group's Granted goes to its only member (split).
local function single(KEYS, ARGV, now, maxttl, pos)
  local sk, gk, pi, hits, mn, f = sunpack('>dddddd', ARGV[1], pos)
  if fmod(f, 2) == 1 then return nil end
  local p = policy(ARGV[3])
  local s
  if p.kind == 2 and gk == 0 then
    local r = fixed1(KEYS[sk], p, now, hits, mn, maxttl)
    if r then return r end
  end
  if p.one and gk == 0 then
    local r, v = one1(KEYS[sk], p, now, hits, mn, maxttl)
    if r then return r end
    s = decraw(v, 0)
    s.p = p
  else
    s = load(KEYS[sk], p, statekind(p))
  end
  local gs = nil
  if gk > 0 then gs = load(KEYS[gk], nil, 9) end
  local d = decide(p, s, gs, now, hits, mn, true, dreset(D))
  if s.dirty then save(KEYS[sk], s, now, maxttl) end
  if gs and gs.dirty then save(KEYS[gk], gs, now, maxttl) end
  return rone(now, d, d.granted)
end

-- ---------------------------------------------------------------------------
-- Undo (mode 8): a Cluster call spanning slots decides every slot at once
-- (mode 2) and, when a slot rejects, gives back exactly what the slots that
-- granted committed (Store.oneTrip). Only the grants it can give back
-- exactly come here: a fixed window's count, and a tier active for ever
-- with no hard or global limit (a plain rate_limit); the Go side sends the
-- other calls spanning slots to the two-step.

-- unbucket: remove up to n hits from the bucket of log l (buckets of width
-- b) that a grant at t added them to, and drop it when it empties. On
-- Redis's clock (never going back on a master) that bucket starts at
-- floor(t, b): ladd joins a newer bucket only when the newest starts after
-- t's, and buckets made since start later. On a caller's clock (tests,
-- replays, which send no call between the grant and its undo) the grant
-- joined the newest bucket when it started at or after floor(t, b). A
-- bucket no longer there (pruned, or emptied by a refund) gives nothing.
local function unbucket(l, t, b, n, caller)
  local at, j = floormul(t, b), nil
  if caller then
    if l[E] >= l[H] and l[2 * l[E] + 2] >= at then j = l[E] end
  else
    for i = l[E], l[H], -1 do
      local x = l[2 * i + 2]
      if x == at then j = i end
      if x <= at then break end
    end
  end
  if not j then return end
  local k = 2 * j + 3
  local x = min(n, l[k])
  l[k], l[SUM] = l[k] - x, l[SUM] - x
  if l[k] > 0 then return end
  for i = j, l[E] - 1 do
    l[2 * i + 2], l[2 * i + 3] = l[2 * i + 4], l[2 * i + 5]
  end
  l[E] = l[E] - 1
  if l[H] > l[E] then lreset(l) end
end

-- unfixed: take n back from the count at key when it is the count of t's
-- window (the grant's), in place (DECRBY keeps the key's expiry); a count
-- it empties is deleted, as save does.
local function unfixed(key, p, t, n)
  if n <= 0 or p.len <= 0 then return end
  local blob = redis.call('GET', key)
  local c = blob and tonumber(blob)
  if not c or c <= 0 then return end
  local start = floormul(t, p.len)
  if cwin(key, start, p.len, t) ~= start then return end
  if c <= n then redis.call('DEL', key) else redis.call('DECRBY', key, n) end
end

-- untier: take back n hits granted at t from the one tier's log and the
-- second log; entered (the grant entered the tier, which a tier active for
-- ever is only once) leaves it again when no hit is left in it. The state
-- keeps its key's expiry unless forget_tiers now says sooner; a state left
-- as a fresh one is deleted.
local function untier(key, p, t, n, entered, maxttl, caller)
  local v = raw(redis.call('GET', key), 5)
  if not v then return end
  local s = decraw(v, 0)
  if s.nt < 1 then return end
  local ts, tr = s.t[1], p.T[1]
  lprune(ts.hits, t, tr.win)
  lprune(s.sec, t, SEC)
  if n > 0 then
    unbucket(ts.hits, t, tr.width, n, caller)
    unbucket(s.sec, t, p.hw, n, caller)
  end
  if entered and ts.hits[E] < ts.hits[H] then ts.inn = false end
  if not ts.inn and s.sec[E] < s.sec[H] then
    redis.call('DEL', key)
    return
  end
  local at = forget_tiers(p, s) or t
  local ms = redis.call('PEXPIRETIME', key)
  if at ~= INF and (ms < 0 or ceildiv(at, 1000) < ms) then ms = ceildiv(at, 1000) end
  if ms < 0 then ms = floormul(t, 1000) / 1000 + maxttl end
  redis.call('SET', key, encstate(s), 'PXAT', sfmt('%d', ms))
end

-- undo: mode 8, at the now of the grants it gives back (caller: that now
-- was the caller's, header field lockTTL 1); on either clock a fixed
-- window's count is told by its expiry (cwin, as under a caller's clock:
-- now is past).
local function undo(KEYS, ARGV, now, maxttl, caller, n, pos)
  CALLER, NOW = true, now
  for i = 1, n do
    local sk, gk, pi, hits, mn, f
    sk, gk, pi, hits, mn, f, pos = sunpack('>dddddd', ARGV[1], pos)
    local p = policy(ARGV[2 + pi])
    if p.kind == 2 then
      unfixed(KEYS[sk], p, now, hits)
    elseif p.kind == 0 and p.one and p.T[1].act == INF and not p.od then
      untier(KEYS[sk], p, now, hits, fmod(idiv(f, 4), 2) == 1, maxttl, caller)
    end
  end
  return rhead(0, now)
end

-- bind: the Lua libraries, at the first call.
local function bind()
  fmod, mpack, munpack = math.fmod, cmsgpack.pack, cmsgpack.unpack
  spack, sunpack, tunpack = struct.pack, struct.unpack, unpack
  ssub, srep, sbyte, sfmt = string.sub, string.rep, string.byte, string.format
end

-- fdecide: a call. clock, from fbatch, holds (t) the instant the calls of
-- a batch decide at once one of them has read Redis's clock.
local function fdecide(KEYS, ARGV, clock)
  if not fmod then bind() end
  local mode, now, maxttl, lockttl, nk, n, pos = sunpack('>dddddd', ARGV[1])
  local token = ARGV[2]
  if mode == 8 then return undo(KEYS, ARGV, now, maxttl, lockttl == 1, n, pos) end

  if mode >= 2 then
    if mode == 6 then
      for i = 1, nk do
        if redis.call('GET', KEYS[nk + i]) == token then redis.call('DEL', KEYS[nk + i]) end
      end
      return rhead(0, 0)
    end
    if mode == 7 then
      -- Seal: if the token still holds every lock, extend them all to
      -- lockttl (the commit lease); else nothing changes.
      for i = 1, nk do
        if redis.call('GET', KEYS[nk + i]) ~= token then return rhead(2, 0) end
      end
      for i = 1, nk do
        redis.call('PEXPIRE', KEYS[nk + i], lockttl)
      end
      return rhead(0, 0)
    end
    if mode == 3 then
      -- Another call holds a lock on one of the keys between its two steps.
      -- A lock of this call's own token is a prepare sent again (go-redis
      -- retries a command whose reply was lost): not busy.
      for i = 1, nk do
        local v = redis.call('GET', KEYS[nk + i])
        if v and v ~= token then return rhead(1, 0) end
      end
    elseif mode <= 3 then
      -- Another call holds a lock on one of the keys between its two steps
      -- (fxbatch checked it already: clock.free).
      local m = nk
      if clock and clock.free then m = 0 end
      for i = 1, m do
        if redis.call('EXISTS', KEYS[nk + i]) == 1 then return rhead(1, 0) end
      end
    else
      for i = 1, nk do
        if redis.call('GET', KEYS[nk + i]) ~= token then
          if mode == 4 then return rhead(2, 0) end
        end
      end
    end
  end

  CALLER = now >= 0
  if not CALLER then
    -- The clock of the Redis master: every process agrees on it. Functions
    -- are replicated by their effects, so reading it is allowed. The calls
    -- of a batch are one atomic step, read at one instant.
    now = clock and clock.t
    if not now then
      local tm = redis.call('TIME')
      now = tonumber(tm[1]) * SEC + tonumber(tm[2])
      if clock then clock.t = now end
    end
  end
  NOW = now

  if n == 1 and (mode <= 2 or mode == 4) then
    local r = single(KEYS, ARGV, now, maxttl, pos)
    if r then
      -- A commit (its token holds every lock, checked above) decides as
      -- its prepare predicted, at the prepare's instant, on the state the
      -- locks kept: the same answer and writes as general's, then the
      -- locks go.
      if mode == 4 then
        for i = 1, nk do redis.call('DEL', KEYS[nk + i]) end
      end
      return r
    end
  end
  if n == 1 and mode == 3 then
    -- A prepare of one take item with no global key granted on a fixed
    -- window or a one tier: lock, and answer the peek (general's answer).
    local sk, gk, pi, hits, mn, f = sunpack('>dddddd', ARGV[1], pos)
    if fmod(f, 2) == 0 and gk == 0 then
      local p, r = policy(ARGV[3]), nil
      if p.kind == 2 then
        r = fixed0(KEYS[sk], p, now, hits, mn)
      elseif p.one then
        r = one1(KEYS[sk], p, now, hits, mn, maxttl, nil, true)
      end
      if r then
        for i = 1, nk do redis.call('SET', KEYS[nk + i], token, 'PX', lockttl) end
        return r
      end
    end
  end
  if n > 1 and n <= 64 and mode <= 2 then
    local r = many(KEYS, ARGV, now, maxttl, n, pos)
    if r then return r end
  end
  return general(KEYS, ARGV, mode, now, maxttl, lockttl, nk, n, pos)
end

-- fbatch: the FCALLs of charon_decide_@V@ a pipeline holds, on a single
-- Redis (not a Cluster: the keys of a batch may be in any slot), made in one
-- call, which saves Redis what it spends per command and per function
-- call. ARGV[1]: big-endian doubles: the number of calls, then per call
-- its numbers of keys and of arguments; the calls' keys follow one another
-- in KEYS and their arguments in ARGV[2..]. Each call is made as its own
-- FCALL would be, in order, on the same instant when on Redis's clock; one
-- whose code fails (a write Redis refuses) answers its error without
-- failing the others. Reply: per call, the length of its reply (a
-- big-endian double; negative: the length of an error message) and the
-- reply.
local SUBK, SUBA, OUT, CLOCK = {}, {}, {}, {}
local function fbatch(KEYS, ARGV)
  if not fmod then bind() end
  local nc, pos = sunpack('>d', ARGV[1])
  local ko, ao = 0, 1
  CLOCK.t = nil
  for j = 1, nc do
    local nk, na
    nk, na, pos = sunpack('>dd', ARGV[1], pos)
    local K, A = SUBK[j], SUBA[j]
    if not K then
      K, A = {}, {}
      SUBK[j], SUBA[j] = K, A
    end
    for i = 1, nk do K[i] = KEYS[ko + i] end
    for i = nk + 1, #K do K[i] = nil end
    for i = 1, na do A[i] = ARGV[ao + i] end
    for i = na + 1, #A do A[i] = nil end
    local ok, r = pcall(fdecide, K, A, CLOCK)
    if ok then
      OUT[2 * j - 1] = spack('>d', #r)
    else
      if type(r) == 'table' then r = r.err end
      r = tostring(r)
      OUT[2 * j - 1] = spack('>d', -#r)
    end
    OUT[2 * j] = r
    ko, ao = ko + nk, ao + na
  end
  return table.concat(OUT, '', 1, 2 * nc)
end

-- fxbatch: fbatch on a Redis Cluster master, for the calls of a pipeline
-- whose slots it serves (each call's keys in one slot, the calls' in
-- several): registered with the flag allow-cross-slot-keys, which lets a
-- function touch keys of several slots of its node as long as they are
-- not declared (an FCALL's declared keys must share one slot), so the
-- keys come in ARGV. ARGV[1]: big-endian doubles: the number of calls, the
-- number of keys of all the calls, then per call its numbers of keys and
-- of arguments; ARGV[2..] the calls' keys one after another, then their
-- arguments. A call is made only if its slot is this node's, stable: a
-- first EXISTS of its lock keys (mode 2; of all its keys in the other
-- modes) fails when a key is not here (the slot moved, or is migrating and
-- not every key is here, or the cluster is down), and then the call is not
-- made and answers an error starting with NOTRUN, for the caller to send it
-- as its own FCALL, which follows the redirection. In mode 2 that EXISTS
-- is the lock check (a lock found: busy). Otherwise as fbatch.
local XNOTRUN = 'NOTRUN '
local function fxbatch(KEYS, ARGV)
  if not fmod then bind() end
  local nc, tk, pos = sunpack('>dd', ARGV[1])
  local ko, ao = 1, 1 + tk
  CLOCK.t = nil
  for j = 1, nc do
    local nk, na
    nk, na, pos = sunpack('>dd', ARGV[1], pos)
    local K, A = SUBK[j], SUBA[j]
    if not K then
      K, A = {}, {}
      SUBK[j], SUBA[j] = K, A
    end
    for i = 1, nk do K[i] = ARGV[ko + i] end
    for i = nk + 1, #K do K[i] = nil end
    for i = 1, na do A[i] = ARGV[ao + i] end
    for i = na + 1, #A do A[i] = nil end
    local mode, _, _, _, sk = sunpack('>ddddd', A[1])
    local from = 1
    if mode == 2 then from = sk + 1 end
    local e = 0
    if nk >= from then e = redis.pcall('EXISTS', tunpack(K, from, nk)) end
    local ok, r
    if type(e) == 'table' then
      ok, r = false, XNOTRUN .. tostring(e.err)
    elseif mode == 2 and e > 0 then
      ok, r = true, rhead(1, 0)
    else
      CLOCK.free = mode == 2
      ok, r = pcall(fdecide, K, A, CLOCK)
      CLOCK.free = nil
    end
    if ok then
      OUT[2 * j - 1] = spack('>d', #r)
    else
      if type(r) == 'table' then r = r.err end
      r = tostring(r)
      OUT[2 * j - 1] = spack('>d', -#r)
    end
    OUT[2 * j] = r
    ko, ao = ko + nk, ao + na
  end
  return table.concat(OUT, '', 1, 2 * nc)
end

redis.register_function{ function_name = 'charon_decide_@V@', callback = fdecide }
redis.register_function{ function_name = 'charon_batch_@V@', callback = fbatch }
redis.register_function{ function_name = 'charon_xbatch_@V@', callback = fxbatch, flags = { 'allow-cross-slot-keys' } }
