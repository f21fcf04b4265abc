// lz4.mjs against frames made by the lz4 tool (lz4-frames.json), and against the tool
// itself on bigger inputs when it is installed: `node --test`.

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { lz4Decompress } from './lz4.mjs';

const fixtures = JSON.parse(readFileSync(new URL('lz4-frames.json', import.meta.url), 'utf8'));

for (const c of fixtures.cases) {
  test(`lz4 frame: ${c.name}`, () => {
    const plain = lz4Decompress(Buffer.from(c.compressed_base64, 'base64'));
    assert.deepEqual(plain, Buffer.from(c.plain_base64, 'base64'));
  });
}

test('lz4: two frames back to back, and an empty frame', () => {
  const [a, b] = fixtures.cases;
  const both = Buffer.concat([Buffer.from(a.compressed_base64, 'base64'), Buffer.from(b.compressed_base64, 'base64')]);
  const plain = Buffer.concat([Buffer.from(a.plain_base64, 'base64'), Buffer.from(b.plain_base64, 'base64')]);
  assert.deepEqual(lz4Decompress(both), plain);
  assert.equal(lz4Decompress(Buffer.from('04224d186440a700000000055dcc02', 'hex')).length, 0);
});

test('lz4: truncated or foreign input is an error, not garbage', () => {
  const frame = Buffer.from(fixtures.cases[0].compressed_base64, 'base64');
  assert.throws(() => lz4Decompress(frame.subarray(0, frame.length - 20)), /lz4/);
  assert.throws(() => lz4Decompress(Buffer.from('not lz4 at all')), /lz4/);
});

const hasTool = spawnSync('lz4', ['--version']).status === 0;

test('lz4: 330 KB in 64 KiB linked blocks, against the lz4 tool', { skip: !hasTool && 'no lz4 tool' }, () => {
  const lines = [];
  for (let i = 0; i < 6000; i++) lines.push(`{"i":${i},"sq":${(i * i) % 1009},"s":"${'x'.repeat(i % 50)}é😀"}`);
  const data = Buffer.from(lines.join('\n'));
  for (const flags of [['-B4', '-BD', '-BX', '--content-size'], ['-9', '-B4', '-BD'], ['-1']]) {
    const frame = execFileSync('lz4', ['-c', '-q', ...flags], { input: data, maxBuffer: 1 << 26 });
    assert.deepEqual(lz4Decompress(frame), data, flags.join(' '));
  }
});
