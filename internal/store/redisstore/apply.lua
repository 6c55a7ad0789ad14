-- The apply part of Charon's decide library (after fastpaths.lua):
-- store.Apply over the items of one call, for the keys of one Redis
-- Cluster slot, with the two-step's lock modes, the call's replies, the
-- batch function, and the functions registered.
--
-- A Redis 7 function library: Redis runs this chunk once, at FUNCTION LOAD,
-- so the helpers below are defined once, not per call; the call is
-- FCALL charon_decide_@V@, or several calls in one FCALL charon_batch_@V@
-- (fbatch, at the end; package redisfunc puts the hash of the library's
-- code in place of @V@, so two versions of Charon sharing one Redis each
-- call their own code).
--
-- KEYS: the call's state keys and global keys (KEYS[1..nk]); in the lock
-- modes, KEYS[nk+i] is the lock key of KEYS[i].
-- ARGV[1]: big-endian doubles (struct '>d', exact for integers below 2^53,
--   and read without making a table): mode, now (µs; -1: use Redis TIME;
--   below -1: TIME plus -(now+1) µs), maxTTL (ms), lockTTL (ms), nk, n
--   (items), then per item: state key index, global key index (0: none),
--   policy index, hits, min (a refund's: -at when it names the take at
--   at of a concurrency limit's slots, tiers.RefundSlots; else ignored),
--   flags (1 refund, 2 shadow); then the call's
--   store.Plan, per item: the index of its group's leader (0: a refund) and
--   of the leader of the first group sharing its global state (0: none).
--   Only the general code reads the plan; the fast paths take calls whose
--   items are each their own group. Pacing: the plan may be followed by one
--   more double, a reservation's offset in µs (see "Pacing" in tiers.lua
--   and fdecide; absent: 0).
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
--   a post-paid policy's form (kinds 0 to 2) ends with one more 1, a
--   concurrency limit's (kind 0) with one more 2
-- Modes: 1 decide; 2 decide unless a key is locked; 3 prepare (lock the
-- keys, decide without writing); 4 finish and commit; 5 finish and abort
-- (refunds and post-paid debits only); 6 release the locks; 7 seal: extend the locks to lockTTL
-- if the token still holds them all (before a commit).
-- Mode 8 undo (undo, below): per item, give back the hits (ARGV's hits)
-- a mode 1 or 2 call granted to the item's group (or to the item) at now
-- (the instant that call answered; lockTTL 1 when that now was the
-- caller's and no call on the keys came since), no lock keys read; flags
-- 4: that grant entered the tier (Burst).
-- Reply: big-endian doubles: status (0 done, 1 a key is locked, 2 a lock
-- was lost), now (µs), then per item: flags (1 OK, 2 Burst, 4
-- LimitedByHard, 8 LimitedByGlobal), Granted, Tier, TierHits, DomainHits,
-- ResourceHits, Remaining, RetryAfter (µs), ResetAfter (µs; +Inf for
-- Unbounded).

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

  -- Groups, as the call's plan (store.Plan) says: lead[i] the leader of
  -- item i's group (nil for a refund), glob[i] the leader of the first
  -- group sharing its global state (0: none); a group asks for the sum of
  -- its members' hits and minimums.
  local lead, glob, gh, gm = {}, {}, {}, {}
  for i = 1, n do
    local l, g
    l, g, pos = sunpack('>dd', ARGV[1], pos)
    if l > 0 then
      local it = items[i]
      if l == i then gh[i], gm[i] = 0, 0 end
      lead[i], glob[i] = l, g
      gh[l] = gh[l] + it.hits
      gm[l] = gm[l] + it.min
    end
  end

  local out, gr = {}, {}

  -- Apply step 1: every refund, in order, then a Peek of one hit.
  for i = 1, n do
    local it = items[i]
    if it.refund then
      -- A refund's min, ignored otherwise, is -at when it names the
      -- take at at of a concurrency limit's slots.
      local slots = nil
      if it.min < 0 then slots = -it.min end
      refund(it.p, st[it.sk], gstate(it), now, it.hits, slots)
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
      local g = glob[i]
      if d.ok and g > 0 and p.kind == 0 and p.glob > 0 then
        local s = 0
        for k = g, i - 1 do
          if lead[k] == k and glob[k] == g and out[k].ok then s = s + out[k].granted end
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
-- granted committed (Store.oneTrip); a call Redis applied after its caller
-- gave up is given back when its reply comes (backFor, giveback.go).
-- Only the grants it can give back exactly come here: a fixed window's
-- count, and a tier active for ever with no hard or global limit (a plain
-- rate_limit); the Go side sends the other calls spanning slots to the
-- two-step, and refunds the other late calls.

-- unbucket: remove up to n hits from the bucket of log l (buckets of width
-- b) that a grant at t added them to, and drop it when it empties. On
-- Redis's clock (never going back on a master) that bucket starts at
-- floor(t, b): ladd joins a newer bucket only when the newest starts after
-- t's, and buckets made since start later; so on a caller's clock that
-- does not go back across a bucket's start (a late reply's give-back, where
-- calls come between the grant and its undo). With caller (oneTrip on a
-- caller's clock: tests, replays, which send no call between the grant and
-- its undo) the grant joined the newest bucket when it started at or after
-- floor(t, b), even when that clock went back. A bucket no longer there
-- (pruned, or emptied by a refund) gives nothing.
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
-- it empties is deleted, as save does. A count with hits reserved in the
-- next window (pace.lua: a state, not a number) names its window: the
-- grant's when it is t's (the reserved hits stay, and so does the key's
-- expiry, the reserved window's end).
local function unfixed(key, p, t, n)
  if n <= 0 or p.len <= 0 then return end
  local blob = redis.call('GET', key)
  if not blob then return end
  local start = floormul(t, p.len)
  local c = tonumber(blob)
  if not c then
    local s = decstate(blob, 2)
    if not s.used or s.at ~= start or s.val <= 0 then return end
    s.val = max(0, s.val - n)
    redis.call('SET', key, encstate(s), 'KEEPTTL')
    return
  end
  if c <= 0 then return end
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

-- fdecide: a call. clock, from fbatch, holds (t) the instant the calls of
-- a batch decide at once one of them has read Redis's clock.
local function fdecide(KEYS, ARGV, clock)
  if not fmod then bind() end
  local mode, now, maxttl, lockttl, nk, n, pos = sunpack('>dddddd', ARGV[1])
  local token = ARGV[2]
  RES, PRUNE = 0, nil
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
    -- of a batch are one atomic step, read at one instant. A now below -1
    -- is a reservation (Go's Store.Reserve): the instant -(now+1) µs after
    -- the master's, added once the shared instant is read. That instant is
    -- not the master's present, so a count alive now need not be of its
    -- window: cwin reads its expiry, as under the caller's clock.
    local off = 0
    if now < -1 then off = -(now + 1) end
    now = clock and clock.t
    if not now then
      local tm = redis.call('TIME')
      now = tonumber(tm[1]) * SEC + tonumber(tm[2])
      if clock then clock.t = now end
    end
    now = now + off
    CALLER = off > 0
  end
  NOW = now
  -- Pacing: a reservation decides at its present plus RES, pruning at the
  -- present, on the general path (the fast paths below do not reserve),
  -- and reads a fixed window's count as of the present (NOW), by its
  -- expiry as under the caller's clock.
  -- The double after the items (six doubles each) and the plan (two per
  -- item): an offset x > 0 (reserve for now + x) or an instant -x (give
  -- back the reservation made for it).
  if #ARGV[1] >= 64 * n + 56 then
    local x = sunpack('>d', ARGV[1], 64 * n + 49)
    if x ~= 0 then
      local at = now + x
      if x < 0 then at = -x end
      RES, PRUNE, now, CALLER = 1, now, at, true
    end
  end
  if RES > 0 then return general(KEYS, ARGV, mode, now, maxttl, lockttl, nk, n, pos) end

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

-- The tables of the batch functions, reused from call to call.
local SUBK, SUBA, OUT, CLOCK = {}, {}, {}, {}

-- subcall: the keys and arguments of a batch's call j, nk keys from
-- KS[ko+1] and na arguments from ARGV[ao+1], in tables reused from call to
-- call.
local function subcall(j, KS, ko, nk, ARGV, ao, na)
  local K, A = SUBK[j], SUBA[j]
  if not K then
    K, A = {}, {}
    SUBK[j], SUBA[j] = K, A
  end
  for i = 1, nk do K[i] = KS[ko + i] end
  for i = nk + 1, #K do K[i] = nil end
  for i = 1, na do A[i] = ARGV[ao + i] end
  for i = na + 1, #A do A[i] = nil end
  return K, A
end

-- subreply: call j's reply in OUT, from its pcall's ok and r.
local function subreply(j, ok, r)
  if ok then
    OUT[2 * j - 1] = spack('>d', #r)
  else
    if type(r) == 'table' then r = r.err end
    r = tostring(r)
    OUT[2 * j - 1] = spack('>d', -#r)
  end
  OUT[2 * j] = r
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
local function fbatch(KEYS, ARGV)
  if not fmod then bind() end
  local nc, pos = sunpack('>d', ARGV[1])
  local ko, ao = 0, 1
  CLOCK.t = nil
  for j = 1, nc do
    local nk, na
    nk, na, pos = sunpack('>dd', ARGV[1], pos)
    local K, A = subcall(j, KEYS, ko, nk, ARGV, ao, na)
    subreply(j, pcall(fdecide, K, A, CLOCK))
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
    local K, A = subcall(j, ARGV, ko, nk, ARGV, ao, na)
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
    subreply(j, ok, r)
    ko, ao = ko + nk, ao + na
  end
  return table.concat(OUT, '', 1, 2 * nc)
end

redis.register_function{ function_name = 'charon_decide_@V@', callback = fdecide }
redis.register_function{ function_name = 'charon_batch_@V@', callback = fbatch }
redis.register_function{ function_name = 'charon_xbatch_@V@', callback = fxbatch, flags = { 'allow-cross-slot-keys' } }
