// node produce.mjs --bootstrap HOST:PORT --topic T --signing-key FILE --proposals FILE.json
//
// Produces each proposal of the file (a JSON array of objects, each sent as JSON.stringify
// writes it, or JSON Lines, each line sent byte for byte), key = its run_id, signed
// (docs/wire.md §4) at the moment of sending, one at a time in order through one
// idempotent producer; checks that Kafka put each in the partition §2 computes.
// Prints {"sent": n}.

import { readFileSync } from 'node:fs';
import kafkajs from 'kafkajs';

import { kafkaClient, parseArgs } from './kafka.mjs';
import { loadSigningKey, partitionFor, sign } from './wire.mjs';

/** [{runId, value}] from the file: a JSON array of objects (each sent as JSON.stringify
 * writes it), or JSON Lines (each line sent byte for byte as written: any JSON encoding is
 * fine on the wire, §3, so `1.0`, `\u00e9` or spaces stay as they are). */
function readProposals(path) {
  const text = readFileSync(path, 'utf8');
  const array = text.trimStart().startsWith('[');
  const items = array
    ? JSON.parse(text).map((p) => ({ proposal: p, value: Buffer.from(JSON.stringify(p), 'utf8') }))
    : text.split('\n').filter((l) => l.trim()).map((l) => ({ proposal: JSON.parse(l), value: Buffer.from(l, 'utf8') }));
  return items.map(({ proposal, value }, i) => {
    if (!proposal || typeof proposal !== 'object' || Array.isArray(proposal) || typeof proposal.run_id !== 'string') {
      throw new Error(`proposal ${i}: not an object with a string run_id`);
    }
    return { runId: proposal.run_id, value };
  });
}

const args = parseArgs(process.argv.slice(2), ['bootstrap', 'topic', 'signing-key', 'proposals']);
const signingKey = loadSigningKey(JSON.parse(readFileSync(args['signing-key'], 'utf8')));
const proposals = readProposals(args.proposals);

const kafka = kafkaClient(args.bootstrap, 'runstate-node-produce');
const admin = kafka.admin();
const producer = kafka.producer({
  createPartitioner: kafkajs.Partitioners.DefaultPartitioner, // Java's murmur2 (§2)
  idempotent: true,
  maxInFlightRequests: 1,
  allowAutoTopicCreation: false,
});
let sent = 0;
try {
  await admin.connect();
  const partitions = (await admin.fetchTopicMetadata({ topics: [args.topic] })).topics[0].partitions.length;
  await producer.connect();
  for (const { runId, value } of proposals) {
    const key = Buffer.from(runId, 'utf8');
    const headers = sign(signingKey, args.topic, key, value, Date.now());
    const [meta] = await producer.send({ topic: args.topic, acks: -1, messages: [{ key, value, headers }] });
    const expected = partitionFor(key, partitions);
    if (meta.partition !== expected) {
      throw new Error(`run ${runId}: Kafka put it in partition ${meta.partition}, §2 says ${expected}`);
    }
    sent += 1;
  }
} finally {
  await producer.disconnect();
  await admin.disconnect();
}
process.stdout.write(`${JSON.stringify({ sent })}\n`);
