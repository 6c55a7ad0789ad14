-- The tiers part of Charon's decide library: package tiers in Lua (the
-- algorithms of tiers/doc.go over one state), with nothing of Redis in it.
-- Numeric helpers, hit logs (tiers/state.go), burst tiers with their
-- phases (tiers/burst.go), token bucket (tiers/bucket.go), fixed window and
-- calendar quota (tiers/fixed.go), and per algorithm its decide, refund and
-- forget (tiers.Peek / Request, Refund, ForgetAt). Function.go concatenates
-- the library's files in a fixed order: this one first, then state.lua,
-- fastpaths.lua and apply.lua.
--
-- Every quantity is an integer below 2^53 (times in µs), so Lua's doubles
-- compute exactly what package tiers computes; Unbounded is math.huge.
-- Integer division and floor are written with math.fmod, which is exact.

local INF = 1 / 0 -- math.huge
local SEC = 1000000
local MAXC = 1125899906842624 -- 2^50, the clamp of copies and min
local MAXCOUNT = 4503599627370496 -- 2^52, the most hits a debit counts
local DEBTB = 64 -- the live buckets a debit keeps a log within
-- Redis runs the library's chunk without the Lua libraries (math,
-- cmsgpack...): they are bound at the first call.
local fmod, mpack, munpack, spack, sunpack, tunpack, ssub, srep, sbyte, sfmt

-- bind: the Lua libraries, at the first call.
local function bind()
  fmod, mpack, munpack = math.fmod, cmsgpack.pack, cmsgpack.unpack
  spack, sunpack, tunpack = struct.pack, struct.unpack, unpack
  ssub, srep, sbyte, sfmt = string.sub, string.rep, string.byte, string.format
end

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

-- Pacing (tiers/reserve.go): RES, 1 for a reservation or its give-back (0:
-- none), and PRUNE, its present, the latest instant a log may be pruned at
-- (nil: none), set per call by fdecide.
local RES, PRUNE = 0, nil

-- prune: drop the buckets no longer counted at t (at most PRUNE).
local function lprune(l, t, w)
  if PRUNE and PRUNE < t then t = PRUNE end
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

-- removeOldest: remove up to n hits counted at t, oldest first (a
-- concurrency limit's refund naming no take).
local function lremoveold(l, t, w, n)
  lprune(l, t, w)
  local done = 0
  while done < n and l[H] <= l[E] do
    local k = 2 * l[H] + 3
    local take = min(n - done, l[k])
    l[k] = l[k] - take
    l[SUM] = l[SUM] - take
    done = done + take
    if l[k] == 0 then l[H] = l[H] + 1 end
  end
  if l[H] > l[E] then lreset(l) end
  return done
end

-- removeSlots: remove up to n hits counted at t from one bucket, the first
-- starting at or after at's (width b): a concurrency limit's refund of the
-- take at at; none when at's bucket has left the window.
local function lremoveslots(l, t, at, w, b, n)
  lprune(l, t, w)
  local from = floormul(at, b)
  if from <= t - w then return 0 end
  for i = l[H], l[E] do
    local j = 2 * i + 2
    if l[j] >= from then
      local take = min(n, l[j + 1])
      l[j + 1] = l[j + 1] - take
      l[SUM] = l[SUM] - take
      if l[j + 1] == 0 then
        -- Drop the emptied bucket, keeping the starts increasing.
        for q = j, 2 * l[E] + 1 do l[q] = l[q + 2] end
        l[E] = l[E] - 1
      end
      if l[H] > l[E] then lreset(l) end
      return take
    end
  end
  return 0
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
-- of an active tier or of a per-second log leaving its window), or nil
-- (tiers/burst.go, nextEvent).
local function next_event(p, s, g, t)
  local best = nil
  for i = 1, min(p.n, s.nt) do
    local ts = s.t[i]
    if ts.inn then
      local tr = p.T[i]
      local e = ts.ent + tr.act
      best = earlier(best, e, t)
      best = earlier(best, e + tr.cool, t)
      -- Only an active tier's hits matter: no tier is entered without
      -- traffic.
      if t < e then best = earlier(best, lnext(ts.hits, t, tr.win), t) end
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

-- refund_tiers: the newest hits of the current tier; a concurrency
-- limit's oldest slots, or with slots (an instant) that take's.
local function refund_tiers(p, s, gs, t, hits, slots)
  local g = gs and gs.log
  local _, _, c = start(p, s, g, t)
  if c == 0 or hits <= 0 then return end
  local tr, n = p.T[c], 0
  if not p.conc then
    n = lremove(s.t[c].hits, t, tr.win, hits)
  elseif slots then
    n = lremoveslots(s.t[c].hits, t, slots, tr.win, tr.width, hits)
  else
    n = lremoveold(s.t[c].hits, t, tr.win, hits)
  end
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
-- Token bucket (tiers/bucket.go): val is what the bucket owes (capacity
-- less balance) in units at time at, unit the units it is kept in: a
-- state kept in another unit than p's (its refill changed) is read in p's,
-- whole credits, as package tiers reads it (bucketOwed, roomOf).

-- owed: the deficit at s.at in p's units, at most twice the capacity and
-- at most 2^53 (bucketOwed).
local MAXOWED = 9007199254740992 -- 2^53
local function owed(p, s)
  local lim = min(2 * p.capU, MAXOWED)
  local d = max(0, s.val)
  if s.unit ~= p.unit and s.unit > 0 then d = min(idiv(d, s.unit), idiv(lim, p.unit)) * p.unit end
  return min(d, lim)
end

-- roomof: a reservation's room (pace.lua) in p's units.
local function roomof(p, s)
  if s.unit == p.unit or s.unit <= 0 then return s.room end
  return min(idiv(s.room, s.unit), p.cap) * p.unit
end

local function balance(p, s, t)
  if not s.used then return p.capU end
  local d = owed(p, s)
  local dt = t - s.at
  if dt > 0 then
    if dt >= ceildiv(d, p.r) then return p.capU end
    d = d - p.r * dt
  end
  return p.capU - d
end

-- setbucket: the balance b at at (setBucket).
local function setbucket(p, s, b, at)
  if s.unit ~= p.unit then s.room = roomof(p, s) end
  s.used, s.val, s.at, s.unit = true, p.capU - b, at, p.unit
  s.dirty = true
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
    if commit and n > 0 then setbucket(p, s, b, max(s.at, t)) end
    return d
  end
  d.rem = whole
  if p.od then
    -- Post-paid: the k hits are debited, down to minus the capacity.
    d.rem = 0
    if commit and k > 0 then
      if k > idiv(b + p.capU, unit) then b = -p.capU else b = b - k * unit end
      setbucket(p, s, b, max(s.at, t))
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
  setbucket(p, s, min(p.capU, b + hits * p.unit), max(s.at, t))
end

local function forget_bucket(p, s)
  if not s.used then return nil end
  local d = owed(p, s)
  if d <= 0 then return s.at end
  return s.at + ceildiv(d, p.r)
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
-- The hits reserved in the window after the state's (s.ahead, pace.lua)
-- are that window's count once it holds t.
local function fwin(p, s, t)
  local start, e = pwin(p, t)
  if s.used and s.at >= start then
    if s.at ~= start then start, e = pwin(p, s.at) end
    return s.at, s.val, e
  end
  if s.used and s.ahead > 0 then
    local _, x = pwin(p, s.at)
    if x == start then return start, s.ahead, e end
  end
  return start, 0, e
end

-- setwin: the state counts cnt in the window starting at start (fwin's);
-- the hits reserved ahead of the state's window are in cnt once past it.
local function setwin(s, start, cnt)
  if s.at ~= start then s.ahead = 0 end
  s.used, s.at, s.val = true, start, cnt
  s.dirty = true
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
    if commit and n > 0 then setwin(s, start, cnt + n) end
    return d
  end
  d.th = cnt
  d.rem = max(0, lim - cnt)
  if p.od then
    -- Post-paid: the k hits are counted all the same.
    d.rem = 0
    if commit and k > 0 then setwin(s, start, min(cnt + k, MAXCOUNT)) end
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
  if cnt <= 0 then return end
  setwin(s, start, max(0, cnt - hits))
end

local function forget_fixed(p, s)
  if not s.used or (s.val <= 0 and s.ahead <= 0) then return nil end
  local _, e = pwin(p, s.at)
  -- Kept until the window reserved in ends.
  if s.ahead > 0 then _, e = pwin(p, e) end
  return e
end

-- Pacing (tiers/reserve.go): reserve and refund_reserved, which decide
-- and refund call when RES > 0, are defined in pace.lua, after this file.
local reserve, refund_reserved

-- ---------------------------------------------------------------------------
-- tiers.Peek / tiers.Request, tiers.Refund, tiers.ForgetAt.

-- decide: the decision on k hits, at least m, written to d (as from
-- newd); commit applies a grant to the states.
local function decide(p, s, gs, t, k, m, commit, d)
  k, m = clamp(k), clamp(m)
  if RES > 0 then return reserve(p, s, gs, t, k, m, commit, d) end
  if p.kind == 0 then return decide_tiers(p, s, gs, t, k, m, commit, d) end
  if p.kind == 1 then return decide_bucket(p, s, t, k, m, commit, d) end
  if p.kind == 2 or p.kind == 4 then return decide_fixed(p, s, t, k, m, commit, d) end
  -- Closed: nothing is ever granted.
  d.retry, d.reset = INF, INF
  return d
end

local function refund(p, s, gs, t, hits, slots)
  hits = clamp(hits)
  if RES > 0 then return refund_reserved(p, s, gs, t, hits) end
  if p.kind == 0 then refund_tiers(p, s, gs, t, hits, slots)
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
