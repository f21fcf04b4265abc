// node verify.mjs --bootstrap HOST:PORT --topic TRANSITIONS_TOPIC
//
// Reads the whole transitions topic (read_committed) up to where it ended when this
// started, checks every run's hash chain (docs/wire.md §6) and prints
// {"transitions": n, "runs": m, "problems": [{partition, offset, run_id, problem, detail}]};
// exits 1 when there is a problem.

import { randomUUID } from 'node:crypto';

import { kafkaClient, parseArgs } from './kafka.mjs';
import { checkChain } from './wire.mjs';

const args = parseArgs(process.argv.slice(2), ['bootstrap', 'topic']);
const kafka = kafkaClient(args.bootstrap, 'runstate-node-verify');

async function readAll(topic) {
  const admin = kafka.admin();
  await admin.connect();
  // Read-committed end (the last stable offset) of each partition, now.
  const offsets = await admin.fetchTopicOffsets(topic);
  await admin.disconnect();
  const end = new Map(offsets.map((o) => [o.partition, BigInt(o.high)]));
  const position = new Map(offsets.map((o) => [o.partition, BigInt(o.low)]));
  const done = () => [...end].every(([p, high]) => position.get(p) >= high);
  const records = [];
  if (done()) return records;

  const consumer = kafka.consumer({ groupId: `runstate-node-verify-${randomUUID()}`, readUncommitted: false });
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  // A batch's last offset counts control records (commit markers) and aborted records
  // that KafkaJS filters out: the position after it is where the next fetch starts.
  consumer.on(consumer.events.END_BATCH_PROCESS, ({ payload }) => {
    const next = BigInt(payload.lastOffset) + 1n;
    if (next > position.get(payload.partition)) position.set(payload.partition, next);
    if (done()) finish();
  });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      if (BigInt(message.offset) < end.get(partition)) {
        records.push({ partition, offset: message.offset, key: message.key, value: message.value });
      }
    },
  });
  const timeoutMs = Number(process.env.RUNSTATE_NODE_VERIFY_TIMEOUT_MS ?? 120000);
  let timer;
  const timedOut = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not at the end of ${topic} after ${timeoutMs} ms: at ${JSON.stringify(Object.fromEntries([...position].map(([p, o]) => [p, String(o)])))}, end ${JSON.stringify(Object.fromEntries([...end].map(([p, o]) => [p, String(o)])))}`)), timeoutMs);
  });
  try {
    await Promise.race([finished, timedOut]);
  } finally {
    clearTimeout(timer);
    await consumer.disconnect();
  }
  return records;
}

const result = checkChain(await readAll(args.topic));
process.stdout.write(`${JSON.stringify(result)}\n`);
process.exitCode = result.problems.length ? 1 : 0;
