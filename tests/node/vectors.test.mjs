// Checks wire.mjs against every conformance vector in docs/vectors: `node --test`.

import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { test } from 'node:test';
import kafkajs from 'kafkajs';

import {
  approvalOutcome, authenticate, canonicalText, canonicalize, carriedDigests, checkChain,
  ed25519PublicHex, relayId,
  loadKeyring, loadSigningKey, murmur2, partitionFor, prefixReaches, proposalDigest, scopeAllows,
  sha256Hex, sign, signedBase, transitionHash, verifyEd25519,
} from './wire.mjs';

const VECTORS = new URL('../../docs/vectors/', import.meta.url);
const load = (name) => JSON.parse(readFileSync(new URL(name, VECTORS), 'utf8'));
const KNOWN = [
  'approvals.json', 'chain.json', 'continuations.json', 'digests.json', 'ed25519.json',
  'partitions.json', 'scopes.json', 'signatures.json', 'verifications.json',
];

test('every vector file is checked here', () => {
  const files = readdirSync(VECTORS).filter((f) => f.endsWith('.json')).sort();
  assert.deepEqual(files, KNOWN);
});

// ------------------------------------------------------------------ partitions.json

const kafkajsPartition = (() => {
  const partitioner = kafkajs.Partitioners.DefaultPartitioner();
  return (key, count) => partitioner({
    topic: 't',
    partitionMetadata: Array.from({ length: count }, (_, i) => ({ partitionId: i, leader: 0 })),
    message: { key },
  });
})();

for (const v of load('partitions.json')) {
  test(`partition of ${JSON.stringify(v.key.length > 20 ? `${v.key.slice(0, 20)}…` : v.key)}`, () => {
    const key = Buffer.from(v.key, 'utf8');
    assert.equal(key.toString('hex'), v.key_hex, 'key_hex is the UTF-8 of key');
    assert.equal(murmur2(key), v.murmur2);
    for (const [count, partition] of Object.entries(v.partition)) {
      assert.equal(partitionFor(key, Number(count)), partition, `our partition of ${count}`);
      assert.equal(kafkajsPartition(key, Number(count)), partition, `kafkajs' partition of ${count}`);
    }
  });
}

// ------------------------------------------------------------------ signatures.json

const signatures = load('signatures.json');
const signingKeys = new Map(signatures.signing_keys.map((k) => [k.key_id, k]));

for (const [i, c] of signatures.cases.entries()) {
  test(`signature ${i}: ${c.algorithm}, key ${c.key}`, () => {
    const keyFile = signingKeys.get(c.key_id);
    assert.equal(keyFile.algorithm, c.algorithm);
    const base = signedBase(c.topic, c.key_id, c.signed_at, c.key, c.value);
    assert.equal(base, c.signed_base);
    const headers = sign(loadSigningKey(keyFile), c.topic, c.key, c.value, c.signed_at);
    assert.deepEqual(headers, {
      'runstate-key-id': c.key_id,
      'runstate-signed-at': String(c.signed_at),
      'runstate-signature': c.signature,
    });
    // and a worker holding the public half accepts it, appended when it was signed
    const entry = keyFile.algorithm === 'ed25519'
      ? { algorithm: 'ed25519', public_key: ed25519PublicHex(keyFile.private_key) }
      : { algorithm: 'hmac-sha256', secret: keyFile.secret };
    const keyring = loadKeyring({ keys: { [c.key_id]: { ...entry, source: 's', authority: 'a' } } });
    const record = { topic: c.topic, key: c.key, value: c.value, headers, timestamp: c.signed_at };
    assert.equal(authenticate(keyring, record).code, 'ok');
  });
}

test('the ed25519 public key of the vectors\' seed is the one in verifications.json', () => {
  const seed = signingKeys.get('agent-1').private_key;
  assert.equal(ed25519PublicHex(seed), load('verifications.json').keyring.keys['agent-1'].public_key);
});

// ------------------------------------------------------------------ verifications.json

const verifications = load('verifications.json');
const keyring = loadKeyring(verifications.keyring);

for (const c of verifications.cases) {
  test(`verification: ${c.name} → ${c.expect}`, () => {
    const record = {
      topic: c.topic,
      key: c.key,
      value: c.value,
      headers: Object.fromEntries(Object.entries(c.headers).map(([n, v]) => [n, Buffer.from(v)])),
      timestamp: c.appended_at,
    };
    const result = authenticate(keyring, record);
    assert.equal(result.code, c.expect, result.detail);
  });
}

// ------------------------------------------------------------------ ed25519.json

const ed25519 = load('ed25519.json');
const oneKeyKeyring = (publicKey) => ({
  keys: { 'suspect-7': { algorithm: 'ed25519', public_key: publicKey, source: 's', authority: 'a' } },
});

for (const [i, c] of ed25519.keys.entries()) {
  test(`ed25519 key ${i}: ${c.name} → ${c.expect}`, () => {
    if (c.expect === 'ok') loadKeyring(oneKeyKeyring(c.public_key));
    else assert.throws(() => loadKeyring(oneKeyKeyring(c.public_key)), /suspect-7/);
  });
}

for (const [i, c] of ed25519.signatures.entries()) {
  test(`ed25519 signature ${i}: ${c.name} → ${c.expect}`, () => {
    const valid = verifyEd25519(c.public_key, Buffer.from(c.message, 'utf8'), c.signature);
    assert.equal(valid ? 'valid' : 'invalid', c.expect);
  });
}

test('a keyring entry without "algorithm" is hmac-sha256', () => {
  const ring = loadKeyring({ keys: { k: { secret: '0123456789abcdef', source: 's', authority: 'a' } } });
  assert.equal(ring.keys.get('k').algorithm, 'hmac-sha256');
});

// ------------------------------------------------------------------ chain.json

const chain = load('chain.json').transitions;

for (const [i, v] of chain.entries()) {
  test(`chain ${i}: ${v.transition.transition_id} canonical text and hash`, () => {
    assert.equal(v.hash, v.transition.hash, 'the vector\'s hash is the transition\'s');
    assert.equal(sha256Hex(Buffer.from(v.canonical, 'utf8')), v.hash, 'hash = sha256(canonical)');
    const ours = canonicalText(v.transition);
    assert.equal(canonicalize(JSON.parse(v.canonical)), ours, 'same JSON value as the vector');
    assert.equal(ours, v.canonical, 'RFC 8785 text, byte for byte');
    assert.equal(transitionHash(v.transition), v.hash);
  });
}

test('chain: links (revisions, prev_hash, transition ids) hold', () => {
  const records = chain.map((v, offset) => ({
    partition: 0, offset, key: v.transition.run_id, value: JSON.stringify(v.transition),
  }));
  const result = checkChain(records);
  assert.equal(result.transitions, chain.length);
  assert.equal(result.runs, 1);
  const notPending = result.problems.filter((p) => !(p.problem === 'hash' && chain[p.offset].canonical !== canonicalText(chain[p.offset].transition)));
  assert.deepEqual(notPending, []);
});

test('chain: a changed byte breaks the record itself or the next link', () => {
  // Re-hash the vector chain the RFC 8785 way, so it is valid on its own.
  const rehashed = [];
  let prev = '';
  for (const v of chain) {
    const t = { ...v.transition, prev_hash: prev };
    t.hash = transitionHash(t);
    prev = t.hash;
    rehashed.push(t);
  }
  const asRecords = (ts) => ts.map((t, offset) => ({ partition: 0, offset, key: t.run_id, value: JSON.stringify(t) }));
  assert.deepEqual(checkChain(asRecords(rehashed)).problems, []);
  const forged = rehashed.map((t) => ({ ...t }));
  forged[0].to_state = 'done';
  assert.deepEqual(checkChain(asRecords(forged)).problems.map((p) => [p.offset, p.problem]), [[0, 'hash']]);
  forged[0].hash = transitionHash(forged[0]);
  assert.deepEqual(checkChain(asRecords(forged)).problems.map((p) => [p.offset, p.problem]), [[1, 'prev_hash']]);
});

// ------------------------------------------------------------------ RFC 8785 spot checks (§6)

test('RFC 8785 numbers and strings as §6 lists them', () => {
  assert.equal(canonicalize(JSON.parse('[1.0, 1e-7, 1e21, -0.0, 0.3333333333333333]')), '[1,1e-7,1e+21,0,0.3333333333333333]');
  assert.equal(canonicalize('\b\f\n\r\t\u0001\u001f"\\/<\u2028\u007f é😀'), '"\\b\\f\\n\\r\\t\\u0001\\u001f\\"\\\\/<\u2028\u007f é😀"');
  assert.equal(canonicalize({ '\ue000': 1, '😀': 2, a: 3, B: 4, é: 5, '': 6 }), '{"":6,"B":4,"a":3,"é":5,"😀":2,"\ue000":1}');
  assert.throws(() => canonicalize(JSON.parse('"\\ud800"')));
});

// ------------------------------------------------------------------ digests.json (§3)

const digests = load('digests.json');

for (const [i, c] of digests.proposals.entries()) {
  test(`digest ${i}: ${c.name}`, () => {
    const proposal = JSON.parse(c.value);
    const content = [
      proposal.event, proposal.reason ?? null, proposal.payload ?? {}, proposal.metadata ?? {},
      c.principal.source, c.principal.authority,
    ];
    assert.equal(canonicalize(content), c.canonical, 'RFC 8785 text of the content');
    assert.equal(sha256Hex(Buffer.from(c.canonical, 'utf8')), c.digest, 'digest = sha256(canonical)');
    assert.equal(proposalDigest(proposal, c.principal), c.digest);
  });
}

for (const [i, c] of digests.pairs.entries()) {
  test(`same proposal ${i}: ${c.name} → ${c.expect}`, () => {
    const [first, second] = [c.first, c.second].map((p) => proposalDigest(JSON.parse(p.value), p.principal));
    assert.equal(first === second ? 'same' : 'reused', c.expect);
    assert.equal(JSON.parse(c.first.value).proposal_id, JSON.parse(c.second.value).proposal_id);
  });
}

test('digest vectors hold both kinds of pair', () => {
  assert.deepEqual(new Set(digests.pairs.map((c) => c.expect)), new Set(['same', 'reused']));
});

// ------------------------------------------------------------------ continuations.json (§7)

const continuations = load('continuations.json');

for (const [i, c] of continuations.relay_ids.entries()) {
  test(`relay id ${i}: ${c.event}`, () => {
    assert.equal(relayId(c.event, c.run_id, c.proposal_id), c.relay_id);
    assert.ok(Buffer.byteLength(c.relay_id) <= 128);
  });
}

for (const [i, c] of continuations.digests.entries()) {
  test(`carried digests ${i}`, () => {
    const ours = carriedDigests(c.steps, c.checkpoint);
    assert.equal(ours.steps, c.steps_digest);
    assert.equal(ours.checkpoint, c.checkpoint_digest);
  });
}

// ------------------------------------------------------------------ approvals.json (§3)

const approvals = load('approvals.json');

for (const [i, c] of approvals.cases.entries()) {
  test(`approval ${i}: ${c.name} → ${c.expect}`, () => {
    assert.ok(c.approval === 'grant' || c.approval === 'deny', 'an approval decision event');
    assert.equal(approvalOutcome(c.run, c.payload, c.principal, c.broker_time), c.expect);
  });
}

test('approval vectors hold every outcome', () => {
  assert.deepEqual(
    new Set(approvals.cases.map((c) => c.expect)),
    new Set(['accepted', 'approval_wrong_pause', 'approval_expired', 'self_approval', 'schema_invalid']),
  );
});

// ------------------------------------------------------------------ scopes.json (§4)

for (const [i, c] of load('scopes.json').entries()) {
  test(`scope ${i}: ${JSON.stringify(c.prefix)} ${c.reaches ? 'reaches' : 'does not reach'} ${JSON.stringify(c.run_id)}`, () => {
    assert.equal(prefixReaches(c.prefix, c.run_id), c.reaches);
    assert.equal(scopeAllows({ run_prefixes: [c.prefix] }, 'm', c.run_id), c.reaches);
  });
}
