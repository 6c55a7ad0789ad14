#!lua name=charon_copies_@V@
-- Charon's copy log function: the operations of package copylog (its doc.go
-- is the contract followed here, path by path) on the copy log of one
-- copy-limited resource, kept as one cmsgpack string. A Redis 7 function
-- library, FCALL charon_copies_@V@ (function.go puts a hash of this file in
-- place of @V@, so two versions of Charon sharing a Redis each call their
-- own code).
--
-- Every quantity is an integer below 2^53 (times in µs, copies at most
-- 2^50), so Lua's doubles compute exactly what copylog computes.
--
-- KEYS[1]: the resource's key.
-- ARGV[1]: the operation: reserve, release, transfer, seize, keepalive,
--   session, expire. ARGV[2]: now in µs, or "" to read Redis TIME.
-- ARGV[3..]: the operation's arguments, already validated by the caller
--   (see rediscopy.go).
--
-- The stored state: {k = last token, h = {[hold id] = {d = domain, c =
-- copies, g = {groups}, s = session, q = request id, k = token, e =
-- expires}}, x = {[transfer id] = {d, c, g, e}}, r = {[request id] = {h =
-- hold id, d = domain, n = granted, k = token, g = groups, e = expires}}}.
-- The counts per domain, per group and in all are rebuilt from holds and
-- transfers on every call.
--
-- The reply: {error code ("" for none), reaped holds, reaped transfers,
-- reaped copies, the operation's fields...}.

local KEEP_MS = 30 * 24 * 3600 * 1000 -- a copy log outlives its last expiry

local function add(C, d, gs, n)
  C.t = C.t + n
  local v = (C.d[d] or 0) + n
  if v ~= 0 then C.d[d] = v else C.d[d] = nil end
  for _, g in ipairs(gs) do
    v = (C.g[g] or 0) + n
    if v ~= 0 then C.g[g] = v else C.g[g] = nil end
  end
end

local function load(key)
  local raw = redis.call('GET', key)
  local st = {}
  if raw then st = cmsgpack.unpack(raw) end
  st.k = st.k or 0
  st.h = st.h or {}
  st.x = st.x or {}
  st.r = st.r or {}
  local C = {d = {}, g = {}, t = 0}
  for _, h in pairs(st.h) do
    h.g = h.g or {}
    add(C, h.d, h.g, h.c)
  end
  for _, x in pairs(st.x) do
    x.g = x.g or {}
    add(C, x.d, x.g, x.c)
  end
  for _, r in pairs(st.r) do r.g = r.g or {} end
  return st, C
end

local function save(key, st, t)
  local last, found = 0, false
  for _, h in pairs(st.h) do if not found or h.e > last then last, found = h.e, true end end
  for _, x in pairs(st.x) do if not found or x.e > last then last, found = x.e, true end end
  for _, r in pairs(st.r) do if not found or r.e > last then last, found = r.e, true end end
  if not found then
    if st.k == 0 then
      redis.call('DEL', key)
      return
    end
    redis.call('SET', key, cmsgpack.pack({k = st.k}), 'PX', string.format('%d', KEEP_MS))
    return
  end
  local ms = KEEP_MS
  if last > t then ms = ms + math.floor((last - t) / 1000) + 1 end
  redis.call('SET', key, cmsgpack.pack(st), 'PX', string.format('%d', ms))
end

-- dropHold removes hold id (not its copies from the counts) and its
-- reservation record when that has expired by t.
local function dropHold(st, id, h, t)
  st.h[id] = nil
  if h.q ~= '' then
    local r = st.r[h.q]
    if r and r.h == id and r.e <= t then st.r[h.q] = nil end
  end
end

local function reap(st, C, t)
  local nh, nx, nc = 0, 0, 0
  for id, h in pairs(st.h) do
    if h.e <= t then
      add(C, h.d, h.g, -h.c)
      dropHold(st, id, h, t)
      nh, nc = nh + 1, nc + h.c
    end
  end
  for id, x in pairs(st.x) do
    if x.e <= t then
      add(C, x.d, x.g, -x.c)
      st.x[id] = nil
      nx, nc = nx + 1, nc + x.c
    end
  end
  for q, r in pairs(st.r) do
    if st.h[r.h] == nil and r.e <= t then st.r[q] = nil end
  end
  return nh, nx, nc
end

local function take(st, C, id, h, n, t)
  add(C, h.d, h.g, -n)
  h.c = h.c - n
  if h.c == 0 then dropHold(st, id, h, t) end
end

-- Every operation gets (st, C, t, A) with A its arguments, and returns
-- (error code, fields).

-- reserve: domain, copies, min (>= 1), hold id, request id, session, lease,
-- domain limit, global limit, then name, limit of each group of the domain.
local function reserve(st, C, t, A)
  local d, k, m, hid, q, sess = A[1], tonumber(A[2]), tonumber(A[3]), A[4], A[5], A[6]
  local lease, D, G = tonumber(A[7]), tonumber(A[8]), tonumber(A[9])
  local names, limits = {}, {}
  local i = 10
  while A[i] do
    names[#names + 1] = A[i]
    limits[#limits + 1] = tonumber(A[i + 1])
    i = i + 2
  end
  local exp = t + lease
  local function context()
    local held = {}
    for j, g in ipairs(names) do held[j] = C.g[g] or 0 end
    return C.d[d] or 0, C.t, held
  end
  if q ~= '' then
    local r = st.r[q]
    if r then
      if r.d ~= d then return 'request_id_reused', {} end
      if exp > r.e then r.e = exp end
      local h = st.h[r.h]
      local dh, th, gh = context()
      if not h then
        -- the first grant's hold is gone: replayed (2), nothing held
        return '', {0, 0, r.h, r.k, 0, r.g, 2, 0, 0, '', dh, th, gh}
      end
      h.s = sess
      if exp > h.e then h.e = exp end
      return '', {1, r.n, r.h, r.k, h.e, r.g, 1, 0, 0, '', dh, th, gh}
    end
  end
  if st.h[hid] then return 'hold_exists', {} end
  local n, lbd, lbg, lbgrp = k, 0, 0, ''
  local free = D - (C.d[d] or 0)
  if free < n then n, lbd = math.max(free, 0), 1 end
  if G > 0 then
    free = G - C.t
    if free < n then n, lbd, lbg = math.max(free, 0), 0, 1 end
  end
  for j, g in ipairs(names) do
    free = limits[j] - (C.g[g] or 0)
    if free < n then n, lbd, lbg, lbgrp = math.max(free, 0), 0, 0, g end
  end
  if n < m then
    local dh, th, gh = context()
    return '', {0, 0, '', 0, 0, {}, 0, lbd, lbg, lbgrp, dh, th, gh}
  end
  st.k = st.k + 1
  st.h[hid] = {d = d, c = n, g = names, s = sess, q = q, k = st.k, e = exp}
  add(C, d, names, n)
  if q ~= '' then st.r[q] = {h = hid, d = d, n = n, k = st.k, g = names, e = exp} end
  local dh, th, gh = context()
  return '', {1, n, hid, st.k, exp, names, 0, lbd, lbg, lbgrp, dh, th, gh}
end

-- release: hold id, copies (0: all).
local function release(st, C, t, A)
  local id, c = A[1], tonumber(A[2])
  local h = st.h[id]
  if not h then return 'unknown_hold', {} end
  if c > h.c then return 'over_release', {h.c} end
  if c == 0 then c = h.c end
  take(st, C, id, h, c, t)
  return '', {c, h.c, h.d, C.d[h.d] or 0, C.t}
end

-- transfer: hold id, copies (0: all), ttl, transfer id.
local function transfer(st, C, t, A)
  local id, c, ttl, xid = A[1], tonumber(A[2]), tonumber(A[3]), A[4]
  local h = st.h[id]
  if not h then return 'unknown_hold', {} end
  if c > h.c then return 'over_transfer', {h.c} end
  if st.x[xid] then return 'transfer_exists', {} end
  if c == 0 then c = h.c end
  local x = {d = h.d, c = c, g = h.g, e = t + ttl}
  st.x[xid] = x
  h.c = h.c - c
  if h.c == 0 then dropHold(st, id, h, t) end
  return '', {c, h.c, x.e}
end

-- seize: transfer id, hold id, session, lease.
local function seize(st, C, t, A)
  local xid, hid, sess, lease = A[1], A[2], A[3], tonumber(A[4])
  local x = st.x[xid]
  if not x then return 'unknown_transfer', {} end
  if st.h[hid] then return 'hold_exists', {} end
  st.x[xid] = nil
  st.k = st.k + 1
  local h = {d = x.d, c = x.c, g = x.g, s = sess, q = '', k = st.k, e = t + lease}
  st.h[hid] = h
  return '', {h.c, h.k, h.e, h.d, h.g}
end

-- keepalive: session, hold id, lease.
local function keepalive(st, C, t, A)
  local sess, hid, lease = A[1], A[2], tonumber(A[3])
  local exp = t + lease
  local n, first = 0, nil
  local function extend(h)
    if exp > h.e then h.e = exp end
    if first == nil or h.e < first then first = h.e end
    n = n + 1
  end
  if hid ~= '' then
    local h = st.h[hid]
    if not h then return 'unknown_hold', {} end
    extend(h)
  else
    for _, h in pairs(st.h) do
      if h.s == sess then extend(h) end
    end
  end
  return '', {n, first or 0}
end

-- session: session.
local function session(st, C, t, A)
  local sess = A[1]
  local n, c = 0, 0
  for id, h in pairs(st.h) do
    if h.s == sess then
      n, c = n + 1, c + h.c
      take(st, C, id, h, h.c, t)
    end
  end
  return '', {n, c}
end

-- expire: reaping only (done by every call); the fields are what the log
-- holds afterwards: holds, staged transfers, copies (both).
local function expire(st, C, t, A)
  local nh, nx = 0, 0
  for _ in pairs(st.h) do nh = nh + 1 end
  for _ in pairs(st.x) do nx = nx + 1 end
  return '', {nh, nx, C.t}
end

local ops = {reserve = reserve, release = release, transfer = transfer, seize = seize,
  keepalive = keepalive, session = session, expire = expire}

local function fcopies(keys, args)
  local op = ops[args[1]]
  if not op then return redis.error_reply('charon: unknown copy operation') end
  local t
  if args[2] == '' then
    local tm = redis.call('TIME')
    t = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
  else
    t = tonumber(args[2])
  end
  local A = {}
  for i = 3, #args do A[i - 2] = args[i] end
  local st, C = load(keys[1])
  local nh, nx, nc = reap(st, C, t)
  local code, fields = op(st, C, t, A)
  save(keys[1], st, t)
  return {code, nh, nx, nc, t, fields}
end

redis.register_function{function_name = 'charon_copies_@V@', callback = fcopies}
