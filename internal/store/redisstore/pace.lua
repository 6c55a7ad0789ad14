-- The pacing part of the decide library (after tiers.lua, whose names it
-- uses): tiers.Reserve and tiers.RefundReserved (tiers/reserve.go), for a
-- call made at now (PRUNE) for the instant t. It defines reserve and
-- refund_reserved, declared in tiers.lua, which decide and refund call
-- when RES > 0 (set per call by fdecide, apply.lua).

-- rclosed: tiers' closed decision, a refusal no wait changes.
local function rclosed(d)
  dreset(d)
  d.retry, d.reset = INF, INF
  return d
end

-- lremove_at: removeAt (tiers/state.go), the hits granted at t out of the
-- bucket they went into (the first starting at or after t's) and newer
-- ones, up to n; the emptied buckets go.
local function lremove_at(l, now, t, w, b, n)
  lprune(l, now, w)
  local at, done, h, e = floormul(t, b), 0, l[H], l[E]
  for i = h, e do
    local j = 2 * i + 2
    if done < n and l[j] >= at then
      local take = min(n - done, l[j + 1])
      l[j + 1], l[SUM], done = l[j + 1] - take, l[SUM] - take, done + take
    end
  end
  local k = h
  for i = h, e do
    local j = 2 * i + 2
    if l[j + 1] > 0 then
      l[2 * k + 2], l[2 * k + 3] = l[j], l[j + 1]
      k = k + 1
    end
  end
  l[E] = k - 1
  if l[H] > l[E] then lreset(l) end
  return done
end

local function reserve_tiers(p, s, gs, now, t, k, m, commit, d)
  if p.n ~= 1 then return rclosed(d) end
  local ts = s.t[1]
  local fresh = (not ts or not ts.inn) and p.T[1].act == INF
  if not fresh and (phase(p, s, 1, now) ~= 1 or phase(p, s, 1, t) ~= 1) then return rclosed(d) end
  -- decide_tiers commits at t through ladd, which prunes at PRUNE.
  return decide_tiers(p, s, gs, t, k, m, commit, d)
end

-- A bucket's reservation also keeps s.ahead, the latest instant reserved,
-- and s.room, what a give-back may restore (tiers/reserve.go).
local function reserve_bucket(p, s, now, t, k, m, commit, d)
  decide_bucket(p, s, t, k, m, false, d)
  if not d.ok then return d end
  -- The balance at t after the grant, carried back to now.
  local bt = balance(p, s, t)
  local b = bt - d.granted * p.unit - p.r * (t - now)
  if b < -p.capU then return rclosed(d) end
  if commit and d.granted > 0 then
    local room = roomof(p, s)
    if now >= s.ahead then room = p.capU end
    s.ahead = max(s.ahead, t)
    setbucket(p, s, b, max(s.at, now))
    s.room = min(room, p.capU - bt)
  end
  return d
end

local function refund_reserved_bucket(p, s, now, t, hits)
  if hits <= 0 or not s.used or t <= now then return end
  local give = min(hits, p.cap) * p.unit
  local room = roomof(p, s)
  if t < s.ahead then give = min(give, room) end
  if give <= 0 then return end
  setbucket(p, s, min(p.capU, balance(p, s, now) + give), max(s.at, now))
  s.room = max(0, room - give)
end

-- A fixed window's (or quota's) reservation in the window holding now is
-- a grant at now; in the next window it is counted in s.ahead, that
-- window's count once it comes (fwin); a later window is refused.
local NEXT = { kind = 2, dirty = false, used = false, at = 0, val = 0, unit = 0, ahead = 0, room = 0 }
local function reserve_fixed(p, s, now, t, k, m, commit, d)
  local start, cnt, e = fwin(p, s, now)
  if t < e then
    decide_fixed(p, s, now, k, m, commit, d)
    if not d.ok then return rclosed(d) end
    return d
  end
  local _, ne = pwin(p, e)
  if t >= ne then return rclosed(d) end
  -- The next window's count: the state's ahead when it is now's window.
  local x = NEXT
  x.used, x.at, x.val, x.ahead = true, e, 0, 0
  if s.used and s.at == start then x.val = s.ahead end
  decide_fixed(p, x, t, k, m, commit, d)
  if not d.ok then return rclosed(d) end
  if commit and d.granted > 0 then
    setwin(s, start, cnt)
    s.ahead = x.val
  end
  return d
end

function reserve(p, s, gs, t, k, m, commit, d)
  local now = PRUNE
  if t <= now then
    -- Not later than the present (a give-back's peek): a plain decision.
    if p.kind == 0 then return decide_tiers(p, s, gs, now, k, m, commit, d) end
    if p.kind == 1 then return decide_bucket(p, s, now, k, m, commit, d) end
    if p.kind == 2 or p.kind == 4 then return decide_fixed(p, s, now, k, m, commit, d) end
    return rclosed(d)
  end
  if p.od then return rclosed(d) end
  if p.kind == 0 then return reserve_tiers(p, s, gs, now, t, k, m, commit, d) end
  if p.kind == 1 then return reserve_bucket(p, s, now, t, k, m, commit, d) end
  if p.kind == 2 or p.kind == 4 then return reserve_fixed(p, s, now, t, k, m, commit, d) end
  return rclosed(d)
end

function refund_reserved(p, s, gs, t, hits)
  local now = PRUNE
  if p.kind == 1 then return refund_reserved_bucket(p, s, now, t, hits) end
  if p.kind ~= 0 then
    local start, _, e = fwin(p, s, now)
    if t < e then return refund_fixed(p, s, now, hits) end
    -- Reserved in the next window.
    if hits > 0 and s.used and s.at == start then
      s.ahead = max(0, s.ahead - hits)
      s.dirty = true
    end
    return
  end
  if hits <= 0 or p.n < 1 or s.nt < 1 then return end
  local tr = p.T[1]
  local done = lremove_at(s.t[1].hits, now, t, tr.win, tr.width, hits)
  lremove_at(s.sec, now, t, SEC, p.hw, done)
  s.dirty = true
  if gs then
    lremove_at(gs.log, now, t, SEC, p.gw, done)
    gs.dirty = true
  end
end

