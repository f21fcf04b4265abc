// runstate's wire format (docs/wire.md), a second implementation written from the spec
// alone: partitioning (§2), signatures (§4), keyrings and key files (§5), RFC 8785
// canonical JSON and the transition hash chain (§6). Node's own crypto, no dependency.

import crypto from 'node:crypto';

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/** Bytes of a string (UTF-8), a Buffer/Uint8Array as is, null/undefined as null. */
export function toBytes(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === 'string') return Buffer.from(utf8.encode(value));
  if (value instanceof Uint8Array) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  throw new TypeError(`not bytes: ${typeof value}`);
}

export function sha256Hex(bytes) {
  return crypto.createHash('sha256').update(bytes ?? Buffer.alloc(0)).digest('hex');
}

// ---------------------------------------------------------------- §2 partitions

/** Kafka's Utils.murmur2 (Java), as an unsigned 32-bit integer. */
export function murmur2(key) {
  const data = toBytes(key) ?? Buffer.alloc(0);
  const length = data.length;
  const m = 0x5bd1e995;
  const r = 24;
  let h = (0x9747b28c ^ length) | 0;
  const length4 = length >>> 2;
  for (let i = 0; i < length4; i++) {
    const i4 = i * 4;
    let k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24);
    k = Math.imul(k, m);
    k ^= k >>> r;
    k = Math.imul(k, m);
    h = Math.imul(h, m);
    h ^= k;
  }
  const tail = length & ~3;
  switch (length % 4) {
    case 3:
      h ^= data[tail + 2] << 16;
    // falls through
    case 2:
      h ^= data[tail + 1] << 8;
    // falls through
    case 1:
      h ^= data[tail];
      h = Math.imul(h, m);
  }
  h ^= h >>> 13;
  h = Math.imul(h, m);
  h ^= h >>> 15;
  return h >>> 0;
}

/** The partition of a keyed record: Kafka's Java default partitioner. */
export function partitionFor(key, partitionCount) {
  if (!Number.isInteger(partitionCount) || partitionCount < 1) throw new RangeError('partition count');
  return (murmur2(key) & 0x7fffffff) % partitionCount;
}

// ---------------------------------------------------------------- §4 signatures

export const HEADER_KEY_ID = 'runstate-key-id';
export const HEADER_SIGNED_AT = 'runstate-signed-at';
export const HEADER_SIGNATURE = 'runstate-signature';
const KEY_ID_RE = /^[A-Za-z0-9._:@-]{1,128}$/;
const SIGNED_AT_RE = /^[0-9]{1,16}$/;
const HEX_RE = /^[0-9a-f]*$/;

/** The six-line signed base (a string; sign its UTF-8 bytes). */
export function signedBase(topic, keyId, signedAt, key, value) {
  return [
    'runstate-proposal-v1',
    topic,
    keyId,
    String(signedAt),
    sha256Hex(toBytes(key)),
    sha256Hex(toBytes(value)),
  ].join('\n');
}

function hexBytes(text, length, what) {
  if (typeof text !== 'string' || text.length !== length * 2 || !HEX_RE.test(text)) {
    throw new Error(`${what}: expected ${length * 2} lowercase hex characters`);
  }
  return Buffer.from(text, 'hex');
}

const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex');

export function ed25519PrivateKey(seedHex) {
  const seed = hexBytes(seedHex, 32, 'ed25519 private key (seed)');
  return crypto.createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, seed]), format: 'der', type: 'pkcs8' });
}

export function ed25519PublicKey(publicHex) {
  const raw = hexBytes(publicHex, 32, 'ed25519 public key');
  return crypto.createPublicKey({ key: Buffer.concat([SPKI_ED25519, raw]), format: 'der', type: 'spki' });
}

// The strict Ed25519 rule (§4): the checks OpenSSL does not make, in front of its verify.
const P = 2n ** 255n - 19n;
const L = 2n ** 252n + 27742317777372353535851937790883648493n;
const mod = (a) => ((a % P) + P) % P;
function powMod(base, exp) {
  let result = 1n;
  let b = mod(base);
  let e = exp;
  while (e > 0n) {
    if (e & 1n) result = (result * b) % P;
    b = (b * b) % P;
    e >>= 1n;
  }
  return result;
}
const D = mod(-121665n * powMod(121666n, P - 2n));
const SQRT_M1 = powMod(2n, (P - 1n) / 4n);
const Y_MASK = (1n << 255n) - 1n;
const littleEndian = (bytes) => BigInt(`0x${Buffer.from(bytes).reverse().toString('hex') || '0'}`);

// Extended coordinates [X, Y, Z, T], x = X/Z, y = Y/Z, xy = T/Z (RFC 8032 §5.1.4).
const IDENTITY = [0n, 1n, 1n, 0n];
function pointAdd([x1, y1, z1, t1], [x2, y2, z2, t2]) {
  const a = mod((y1 - x1) * (y2 - x2));
  const b = mod((y1 + x1) * (y2 + x2));
  const c = mod(2n * D * t1 * t2);
  const d = mod(2n * z1 * z2);
  const [e, f, g, h] = [b - a, d - c, d + c, b + a];
  return [mod(e * f), mod(g * h), mod(f * g), mod(e * h)];
}
function pointMul(n, point) {
  let out = IDENTITY;
  let q = point;
  for (let k = n; k > 0n; k >>= 1n) {
    if (k & 1n) out = pointAdd(out, q);
    q = pointAdd(q, q);
  }
  return out;
}
const isIdentity = ([x, y, z]) => mod(x) === 0n && mod(y - z) === 0n;

/** The y coordinates (an encoding's low 255 bits) of the 8 torsion points, with the
 * non-canonical y + p of two of them: small order, whatever the sign bit. */
const SMALL_ORDER_Y = (() => {
  // the torsion part [L]Q of the first point Q (y = 2, 3, ...) whose torsion has order 8
  for (let y = 2n; ; y++) {
    const q = decodePoint(y);
    if (typeof q === 'string') continue;
    const t = pointMul(L, q);
    if (isIdentity(pointMul(4n, t))) continue;
    const ys = new Set();
    let point = IDENTITY;
    for (let k = 0; k < 8; k++) {
      const zi = powMod(point[2], P - 2n);
      const py = mod(point[1] * zi);
      ys.add(py);
      if (py + P <= Y_MASK) ys.add(py + P);
      point = pointAdd(point, t);
    }
    return ys;
  }
})();

/** The point of an encoding (as a little-endian integer), or why there is none. */
function decodePoint(encoded) {
  const y = encoded & Y_MASK;
  const sign = encoded >> 255n;
  if (y >= P) return 'not canonical: y is not below 2^255 - 19';
  const u = mod(y * y - 1n);
  const v = mod(D * y * y + 1n);
  let x = mod(u * powMod(v, 3n) * powMod(u * powMod(v, 7n), (P - 5n) / 8n));
  if (mod(v * x * x) === mod(-u)) x = mod(x * SQRT_M1);
  if (mod(v * x * x) !== u) return 'not a point of the curve';
  if (x === 0n && sign === 1n) return 'not canonical: x is 0 and the sign bit is set';
  if ((x & 1n) !== sign) x = P - x;
  return [x, y, 1n, mod(x * y)];
}

/** Why a 32-byte public key is refused (§4), or null. */
export function ed25519PublicKeyProblem(raw) {
  if (raw.length !== 32) return 'not 32 bytes';
  const encoded = littleEndian(raw);
  if (SMALL_ORDER_Y.has(encoded & Y_MASK)) return 'a point of small order';
  const point = decodePoint(encoded);
  if (typeof point === 'string') return point;
  if (isIdentity(pointMul(8n, point))) return 'a point of small order';
  if (!isIdentity(pointMul(L, point))) return 'not in the prime-order subgroup (mixed order)';
  return null;
}

/** Why a 64-byte signature is refused before the equation (§4), or null. */
export function ed25519SignatureProblem(signature) {
  if (signature.length !== 64) return 'not 64 bytes';
  if (littleEndian(signature.subarray(32)) >= L) return 'S is not below L';
  if (SMALL_ORDER_Y.has(littleEndian(signature.subarray(0, 32)) & Y_MASK)) return 'R is of small order';
  return null;
}

const acceptedKeys = new Map();

/** §4's Ed25519 verification: the strict rule, then RFC 8032's equation (OpenSSL). */
export function verifyEd25519(publicHex, message, signatureHex) {
  if (typeof signatureHex !== 'string' || signatureHex.length !== 128 || !HEX_RE.test(signatureHex)) return false;
  let key = acceptedKeys.get(publicHex);
  if (key === undefined) {
    const raw = hexBytes(publicHex, 32, 'ed25519 public key');
    key = ed25519PublicKeyProblem(raw) === null ? ed25519PublicKey(publicHex) : null;
    acceptedKeys.set(publicHex, key);
  }
  const signature = Buffer.from(signatureHex, 'hex');
  if (key === null || ed25519SignatureProblem(signature) !== null) return false;
  return crypto.verify(null, toBytes(message), key, signature);
}

/** The public key (hex) of a 32-byte seed (hex). */
export function ed25519PublicHex(seedHex) {
  const der = crypto.createPublicKey(ed25519PrivateKey(seedHex)).export({ format: 'der', type: 'spki' });
  return der.subarray(SPKI_ED25519.length).toString('hex');
}

function hmacHex(secret, base) {
  return crypto.createHmac('sha256', Buffer.from(utf8.encode(secret))).update(utf8.encode(base)).digest('hex');
}

/** A signing key file (§5) as an object; checks its shape. */
export function loadSigningKey(obj) {
  if (!obj || typeof obj !== 'object') throw new Error('signing key: not an object');
  if (typeof obj.key_id !== 'string' || !KEY_ID_RE.test(obj.key_id)) throw new Error('signing key: bad key_id');
  if (obj.algorithm === 'ed25519') {
    return { keyId: obj.key_id, algorithm: 'ed25519', privateKey: ed25519PrivateKey(obj.private_key) };
  }
  if (obj.algorithm === 'hmac-sha256') {
    if (typeof obj.secret !== 'string' || obj.secret.length < 16) throw new Error('signing key: bad secret');
    return { keyId: obj.key_id, algorithm: 'hmac-sha256', secret: obj.secret };
  }
  throw new Error(`signing key: unknown algorithm ${JSON.stringify(obj.algorithm)}`);
}

/** The signature (hex) of the signed base, by the signing key's algorithm. */
export function signBase(signingKey, base) {
  if (signingKey.algorithm === 'ed25519') {
    return crypto.sign(null, Buffer.from(utf8.encode(base)), signingKey.privateKey).toString('hex');
  }
  return hmacHex(signingKey.secret, base);
}

/** The three headers signing (key, value) for `topic` at `signedAt` (ms). */
export function sign(signingKey, topic, key, value, signedAt = Date.now()) {
  if (!Number.isSafeInteger(signedAt) || signedAt < 0) throw new RangeError('signedAt');
  const base = signedBase(topic, signingKey.keyId, signedAt, key, value);
  return {
    [HEADER_KEY_ID]: signingKey.keyId,
    [HEADER_SIGNED_AT]: String(signedAt),
    [HEADER_SIGNATURE]: signBase(signingKey, base),
  };
}

// ---------------------------------------------------------------- §5 keyrings

const nullable = (v) => v === undefined || v === null || Number.isSafeInteger(v);

/** A keyring (§5) as parsed JSON, with its keys checked and made ready to verify. */
export function loadKeyring(obj) {
  if (!obj || typeof obj !== 'object' || !obj.keys || typeof obj.keys !== 'object') {
    throw new Error('keyring: no "keys" object');
  }
  const keys = new Map();
  for (const [keyId, entry] of Object.entries(obj.keys)) {
    if (!KEY_ID_RE.test(keyId)) throw new Error(`keyring: bad key id ${JSON.stringify(keyId)}`);
    for (const limit of ['not_before_ms', 'not_after_ms', 'revoked_at_ms']) {
      if (!nullable(entry[limit])) throw new Error(`keyring: ${keyId}.${limit} is not an integer or null`);
    }
    // An entry without "algorithm" is hmac-sha256 (§5).
    const algorithm = entry.algorithm ?? 'hmac-sha256';
    const key = { ...entry, algorithm, keyId };
    if (algorithm === 'ed25519') {
      const problem = ed25519PublicKeyProblem(hexBytes(entry.public_key, 32, `keyring: ${keyId}: public_key`));
      if (problem !== null) {
        throw new Error(`keyring: key id ${keyId}: ed25519 public key ${entry.public_key} refused: ${problem}`);
      }
    } else if (algorithm === 'hmac-sha256') {
      if (typeof entry.secret !== 'string' || entry.secret.length < 16) throw new Error(`keyring: ${keyId}: bad secret`);
    } else throw new Error(`keyring: ${keyId}: unknown algorithm ${JSON.stringify(entry.algorithm)}`);
    keys.set(keyId, key);
  }
  return {
    keys,
    signatureMaxAgeMs: obj.signature_max_age_ms ?? 300000,
    clockSkewMs: obj.clock_skew_ms ?? 30000,
  };
}

/** Does the signature (hex) verify over the base with this keyring entry? */
export function verifySignature(key, base, signatureHex) {
  const bytes = Buffer.from(utf8.encode(base));
  if (key.algorithm === 'ed25519') return verifyEd25519(key.public_key, bytes, signatureHex);
  if (signatureHex.length !== 64 || !HEX_RE.test(signatureHex)) return false;
  const expected = Buffer.from(hmacHex(key.secret, base), 'hex');
  return crypto.timingSafeEqual(expected, Buffer.from(signatureHex, 'hex'));
}

/** Headers as a Map name → [values as Buffers], from kafkajs' object form (a value or an
 * array of values per name) or from an array of [name, value] pairs. */
function headerValues(headers) {
  const out = new Map();
  const add = (name, value) => {
    if (!out.has(name)) out.set(name, []);
    out.get(name).push(value);
  };
  if (Array.isArray(headers)) for (const [name, value] of headers) add(name, value);
  else {
    for (const [name, value] of Object.entries(headers ?? {})) {
      if (Array.isArray(value)) value.forEach((v) => add(name, v));
      else add(name, value);
    }
  }
  return out;
}

function headerText(values) {
  if (!values || values.length !== 1 || values[0] === null || values[0] === undefined) return null;
  try {
    return typeof values[0] === 'string' ? values[0] : strictUtf8.decode(values[0]);
  } catch {
    return null;
  }
}

/**
 * §4: does a worker accept this record? `record` = {topic, key, value, headers, timestamp}
 * (key/value: string, bytes or null; timestamp: the broker's append time, ms).
 * Returns {code: 'ok', key} or {code: 'unauthenticated' | 'stale_signature', detail}.
 */
export function authenticate(keyring, record) {
  const fail = (code, detail) => ({ code, detail });
  const headers = headerValues(record.headers);
  const texts = {};
  for (const name of [HEADER_KEY_ID, HEADER_SIGNED_AT, HEADER_SIGNATURE]) {
    const values = headers.get(name);
    if (!values) return fail('unauthenticated', `no ${name} header`);
    texts[name] = headerText(values);
    if (texts[name] === null) return fail('unauthenticated', `${name}: not one UTF-8 value`);
  }
  const keyId = texts[HEADER_KEY_ID];
  const signedAtText = texts[HEADER_SIGNED_AT];
  const signature = texts[HEADER_SIGNATURE];
  if (!KEY_ID_RE.test(keyId)) return fail('unauthenticated', 'malformed key id');
  if (!SIGNED_AT_RE.test(signedAtText)) return fail('unauthenticated', 'malformed signed-at');
  if (!HEX_RE.test(signature)) return fail('unauthenticated', 'signature is not lowercase hex');
  // 2. the key id is in the keyring
  const key = keyring.keys.get(keyId);
  if (!key) return fail('unauthenticated', `unknown key id ${keyId}`);
  // 3. the signature verifies over the base built from where the record was read
  const base = signedBase(record.topic, keyId, signedAtText, record.key, record.value);
  if (!verifySignature(key, base, signature)) return fail('unauthenticated', 'bad signature');
  // 4. the key is valid at the broker timestamp
  const t = Number(record.timestamp);
  if (key.not_before_ms != null && !(key.not_before_ms <= t)) return fail('unauthenticated', 'key not yet valid');
  if (key.not_after_ms != null && !(t < key.not_after_ms)) return fail('unauthenticated', 'key expired');
  if (key.revoked_at_ms != null && !(t < key.revoked_at_ms)) return fail('unauthenticated', 'key revoked');
  // 5. the signature is fresh
  const signedAt = Number(signedAtText);
  if (t - signedAt > keyring.signatureMaxAgeMs) return fail('stale_signature', 'signed too long before append');
  if (signedAt - t > keyring.clockSkewMs) return fail('stale_signature', 'signed too far after append');
  return { code: 'ok', key };
}

/** The characters a run id prefix ends on (§4). */
export const SCOPE_SEPARATORS = '-_.:/@#';

/** Does run id prefix `prefix` reach `runId` (§4)? On a separator boundary only. */
export function prefixReaches(prefix, runId) {
  if (!runId.startsWith(prefix)) return false;
  return runId.length === prefix.length || prefix === ''
    || SCOPE_SEPARATORS.includes(prefix.at(-1)) || SCOPE_SEPARATORS.includes(runId[prefix.length]);
}

/** A key's scope (§4): may it act on this machine and run id? Absent/null = no limit. */
export function scopeAllows(key, machine, runId) {
  if (key.machines != null && !key.machines.includes(machine)) return false;
  if (key.run_prefixes != null && !key.run_prefixes.some((p) => prefixReaches(p, runId))) return false;
  return true;
}

// ---------------------------------------------------------------- §3 the same proposal, approvals

/**
 * The content digest of a proposal (§3): hex SHA-256 of the RFC 8785 text of
 * [event, reason, payload, metadata, principal.source, principal.authority], with an
 * absent reason as null and an absent payload or metadata as {}. `proposal` is the value
 * as JSON.parse returns it; `principal` what the signing key proves.
 */
export function proposalDigest(proposal, principal) {
  const content = [
    proposal.event, proposal.reason ?? null, proposal.payload ?? {}, proposal.metadata ?? {},
    principal.source, principal.authority,
  ];
  return sha256Hex(Buffer.from(utf8.encode(canonicalize(content))));
}

/**
 * The proposal id of a message between runs (§7): `relay:<event>:` and the hex SHA-256 of
 * the new run's id, a NUL byte and its create's proposal id.
 */
export function relayId(event, runId, proposalId) {
  return `relay:${event}:${sha256Hex(Buffer.from(utf8.encode(`${runId}\u0000${proposalId}`)))}`;
}

/**
 * The digests a continuation's ask carries (§7): of the carried steps, RFC 8785 of
 * [[name, idempotency_key, attempts, result], ...] sorted by name (absent key null,
 * absent attempts 1, absent result null); of the checkpoint, RFC 8785 of it.
 */
export function carriedDigests(steps, checkpoint) {
  const rows = Object.keys(steps).sort().map((name) => {
    const s = steps[name];
    return [name, s.idempotency_key ?? null, s.attempts ?? 1, s.result ?? null];
  });
  const digest = (value) => sha256Hex(Buffer.from(utf8.encode(canonicalize([value]))));
  return { steps: digest(rows), checkpoint: digest(checkpoint) };
}

const isCount = (v) => Number.isSafeInteger(v) && v >= 0;

/**
 * An approver's decision (an event with `approval: grant | deny`, §3) against the run's
 * pause: 'accepted', or the code it is refused with. `run` = {revision, pause: {revision,
 * asked_by: {source, authority}} | null}; `payload` as parsed; `brokerTime` the record's
 * broker timestamp (ms).
 */
export function approvalOutcome(run, payload, principal, brokerTime) {
  const names = Object.keys(payload ?? {}).sort();
  if (names.join() !== 'expires_at_ms,pause' || !isCount(payload.pause) || !isCount(payload.expires_at_ms)) {
    return 'schema_invalid';
  }
  const pause = run.pause ?? null;
  if (payload.pause !== (pause === null ? run.revision : pause.revision)) return 'approval_wrong_pause';
  if (payload.expires_at_ms <= brokerTime) return 'approval_expired';
  if (pause !== null && pause.asked_by.source === principal.source) return 'self_approval';
  return 'accepted';
}

// ---------------------------------------------------------------- §6 RFC 8785, hash chain

/** RFC 8785 (JCS) text of a JSON value (as JSON.parse returns it). */
export function canonicalize(value) {
  if (value === null || typeof value === 'boolean') return JSON.stringify(value);
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new RangeError('JCS: a number must be finite');
    return JSON.stringify(value); // Number.prototype.toString; -0 → "0"
  }
  if (typeof value === 'string') {
    if (!value.isWellFormed()) throw new RangeError('JCS: a string with a lone surrogate');
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalize).join(',')}]`;
  if (typeof value === 'object') {
    // Array.prototype.sort without a comparator orders strings by UTF-16 code units.
    const names = Object.keys(value).sort();
    return `{${names.map((n) => `${canonicalize(n)}:${canonicalize(value[n])}`).join(',')}}`;
  }
  throw new TypeError(`JCS: not a JSON value: ${typeof value}`);
}

const HASHED_FIELDS = [
  'schema_version', 'transition_id', 'run_id', 'machine', 'revision', 'from_state', 'to_state',
  'event', 'proposal_id', 'principal', 'reason', 'payload', 'metadata', 'retry_count', 'at_ms',
  'prev_hash',
];

/** The array hashed for a transition (§6); throws on a transition missing a field. */
export function hashedArray(transition) {
  if (!transition || typeof transition !== 'object' || Array.isArray(transition)) {
    throw new TypeError('a transition is a JSON object');
  }
  for (const field of HASHED_FIELDS) {
    if (!Object.hasOwn(transition, field)) throw new TypeError(`no field ${field}`);
  }
  const p = transition.principal;
  if (!p || typeof p !== 'object' || !Object.hasOwn(p, 'source') || !Object.hasOwn(p, 'authority')) {
    throw new TypeError('principal is not {source, authority}');
  }
  const t = transition;
  const items = [
    t.schema_version, t.transition_id, t.run_id, t.machine, t.revision, t.from_state, t.to_state,
    t.event, t.proposal_id, p.source, p.authority, t.reason, t.payload, t.metadata, t.retry_count,
    t.at_ms, t.prev_hash,
  ];
  const extra = {};
  if (t.machine_version != null) extra.machine_version = t.machine_version;
  if (t.heartbeat_at_ms != null) extra.heartbeat_at_ms = t.heartbeat_at_ms;
  if (Object.keys(extra).length) items.push(extra);
  return items;
}

export function canonicalText(transition) {
  return canonicalize(hashedArray(transition));
}

export function transitionHash(transition) {
  return sha256Hex(Buffer.from(utf8.encode(canonicalText(transition))));
}

/**
 * The chain check of §6 over transition records read from a topic:
 * records = [{partition, offset, key, value}] (key/value bytes or strings; offsets as
 * strings or numbers). Returns {transitions, runs, problems: [{partition, offset, run_id,
 * problem, detail}]}. Each record is checked against the one before it of its run (as
 * read, even if that one had a problem), so a changed record flags itself and a changed
 * hash flags the next link.
 */
export function checkChain(records) {
  const sorted = [...records].sort(
    (a, b) => a.partition - b.partition || Number(BigInt(a.offset) - BigInt(b.offset)),
  );
  const runs = new Map(); // run id → {partition, revision, hash}
  const problems = [];
  for (const rec of sorted) {
    const at = { partition: rec.partition, offset: Number(rec.offset) };
    const report = (runId, problem, detail) => problems.push({ ...at, run_id: runId, problem, detail });
    const keyText = rec.key == null ? null : decodeOrNull(toBytes(rec.key));
    let t;
    try {
      t = JSON.parse(strictUtf8.decode(toBytes(rec.value) ?? Buffer.alloc(0)));
    } catch (err) {
      report(keyText, 'not_json', rec.value == null ? 'a tombstone' : String(err.message));
      continue;
    }
    if (!t || typeof t !== 'object' || Array.isArray(t) || typeof t.run_id !== 'string') {
      report(keyText, 'malformed', 'not a transition object with a string run_id');
      continue;
    }
    const runId = t.run_id;
    if (keyText !== runId) report(runId, 'key_mismatch', `record key ${JSON.stringify(keyText)} is not the run id`);
    let recomputed = null;
    try {
      recomputed = transitionHash(t);
    } catch (err) {
      report(runId, 'malformed', String(err.message));
    }
    const prev = runs.get(runId);
    if (prev && prev.partition !== rec.partition) {
      report(runId, 'split_run', `run also in partition ${prev.partition}`);
    }
    const expectedRevision = prev ? prev.revision + 1 : 0;
    if (t.revision !== expectedRevision) {
      report(runId, 'revision', `revision ${JSON.stringify(t.revision)}, expected ${expectedRevision}`);
    }
    const expectedPrev = prev ? prev.hash : '';
    if (t.prev_hash !== expectedPrev) {
      report(runId, 'prev_hash', `prev_hash ${JSON.stringify(t.prev_hash)}, expected ${JSON.stringify(expectedPrev)}`);
    }
    if (recomputed !== null && t.hash !== recomputed) {
      report(runId, 'hash', `hash ${JSON.stringify(t.hash)}, recomputed ${recomputed}`);
    }
    if (t.transition_id !== `${runId}:${t.revision}`) {
      report(runId, 'transition_id', `transition_id ${JSON.stringify(t.transition_id)}`);
    }
    runs.set(runId, {
      partition: prev ? prev.partition : rec.partition,
      revision: Number.isSafeInteger(t.revision) ? t.revision : expectedRevision,
      hash: t.hash,
    });
  }
  return { transitions: sorted.length, runs: runs.size, problems };
}

function decodeOrNull(bytes) {
  try {
    return strictUtf8.decode(bytes);
  } catch {
    return null;
  }
}
