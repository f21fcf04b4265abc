// What the two CLIs share: argument parsing and a KafkaJS client that logs to stderr
// (stdout carries the CLI's JSON answer only).

import kafkajs from 'kafkajs';

import { registerLz4 } from './lz4.mjs';

const { Kafka, logLevel } = kafkajs;

// runstate's native worker compresses what it writes with LZ4.
registerLz4();

export function parseArgs(argv, names) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i].replace(/^--/, '');
    if (!argv[i].startsWith('--') || !names.includes(name) || i + 1 >= argv.length) {
      usage(names, `unexpected argument ${JSON.stringify(argv[i])}`);
    }
    out[name] = argv[++i];
  }
  for (const name of names) if (out[name] === undefined) usage(names, `--${name} is required`);
  return out;
}

function usage(names, problem) {
  process.stderr.write(`${problem}\nusage: node ${process.argv[1]} ${names.map((n) => `--${n} VALUE`).join(' ')}\n`);
  process.exit(2);
}

const LEVELS = { [logLevel.ERROR]: 'ERROR', [logLevel.WARN]: 'WARN', [logLevel.INFO]: 'INFO', [logLevel.DEBUG]: 'DEBUG' };

function stderrLog() {
  return ({ namespace, level, log }) => {
    const { message, ...extra } = log;
    process.stderr.write(`kafkajs ${LEVELS[level]} ${namespace}: ${message} ${JSON.stringify(extra)}\n`);
  };
}

export function kafkaClient(bootstrap, clientId) {
  return new Kafka({
    clientId,
    brokers: bootstrap.split(','),
    // The broker's group coordinator answers "loading" for a moment after it starts: retried.
    logLevel: process.env.RUNSTATE_NODE_DEBUG ? logLevel.DEBUG : logLevel.NOTHING,
    logCreator: stderrLog,
    retry: { retries: 8 },
  });
}
