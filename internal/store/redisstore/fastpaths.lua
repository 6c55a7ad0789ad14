-- The fast paths of the decide library (after state.lua): one1 (the
-- one-tier path), fixed1 (the fixed-window path), fixed0 (a fixed
-- window's peek) and many (several one-tier or fixed-window items), each
-- the general code of apply.lua written out for one common case, with the
-- same answers, states and expiry times (doc.go lists each with the Go
-- function it specialises, the test that holds it equal and its measured
-- saving).

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

