// LZ4 frame decompression (the LZ4 frame format 1.6.x and its block format), for reading
// record batches that a runstate worker compresses with LZ4: KafkaJS decompresses only
// GZIP by itself. Decompression only; checksums are not verified (Kafka's CRC32C over
// the record batch already covers the compressed bytes).

import kafkajs from 'kafkajs';

const { CompressionCodecs, CompressionTypes } = kafkajs;

const FRAME_MAGIC = 0x184d2204;

class Output {
  constructor(capacity) {
    this.bytes = new Uint8Array(Math.max(capacity, 1024));
    this.length = 0;
  }

  reserve(n) {
    if (this.length + n <= this.bytes.length) return;
    let size = this.bytes.length * 2;
    while (size < this.length + n) size *= 2;
    const bigger = new Uint8Array(size);
    bigger.set(this.bytes.subarray(0, this.length));
    this.bytes = bigger;
  }

  append(src) {
    this.reserve(src.length);
    this.bytes.set(src, this.length);
    this.length += src.length;
  }
}

function fail(message) {
  throw new Error(`lz4: ${message}`);
}

/** Decompresses one LZ4 block into `out`; matches may reach back into what `out`
 * already holds (linked blocks of one frame). */
function decompressBlock(src, out) {
  let i = 0;
  const readLength = (n) => {
    let b;
    do {
      if (i >= src.length) fail('truncated length');
      b = src[i++];
      n += b;
    } while (b === 255);
    return n;
  };
  while (i < src.length) {
    const token = src[i++];
    let literals = token >>> 4;
    if (literals === 15) literals = readLength(literals);
    if (i + literals > src.length) fail('truncated literals');
    out.append(src.subarray(i, i + literals));
    i += literals;
    if (i === src.length) break; // the last sequence is literals only
    if (i + 2 > src.length) fail('truncated offset');
    const offset = src[i] | (src[i + 1] << 8);
    i += 2;
    if (offset === 0 || offset > out.length) fail(`bad match offset ${offset}`);
    let matchLength = token & 15;
    if (matchLength === 15) matchLength = readLength(matchLength);
    matchLength += 4;
    out.reserve(matchLength);
    const bytes = out.bytes;
    let from = out.length - offset;
    let to = out.length;
    for (let k = 0; k < matchLength; k++) bytes[to++] = bytes[from++]; // may overlap
    out.length = to;
  }
}

/** The decompressed bytes of a sequence of LZ4 frames (skippable frames skipped). */
export function lz4Decompress(input) {
  const buf = Buffer.from(input.buffer, input.byteOffset, input.byteLength);
  const out = new Output(buf.length * 4);
  let pos = 0;
  const need = (n) => {
    if (pos + n > buf.length) fail('truncated frame');
  };
  while (pos < buf.length) {
    need(4);
    const magic = buf.readUInt32LE(pos);
    pos += 4;
    if (magic >= 0x184d2a50 && magic <= 0x184d2a5f) { // a skippable frame
      need(4);
      pos += 4 + buf.readUInt32LE(pos);
      continue;
    }
    if (magic !== FRAME_MAGIC) fail(`not an LZ4 frame (magic ${magic.toString(16)})`);
    need(3);
    const flg = buf[pos];
    if (flg >>> 6 !== 1) fail(`frame version ${flg >>> 6}`);
    const blockChecksum = (flg & 0x10) !== 0;
    const contentSize = (flg & 0x08) !== 0;
    const contentChecksum = (flg & 0x04) !== 0;
    if (flg & 0x01) fail('frames with a dictionary are not supported');
    pos += 2 + (contentSize ? 8 : 0) + 1; // FLG, BD, content size, header checksum
    for (;;) {
      need(4);
      const word = buf.readUInt32LE(pos);
      pos += 4;
      if (word === 0) break; // end mark
      const size = word & 0x7fffffff;
      need(size + (blockChecksum ? 4 : 0));
      const block = buf.subarray(pos, pos + size);
      if (word & 0x80000000) out.append(block); // stored uncompressed
      else decompressBlock(block, out);
      pos += size + (blockChecksum ? 4 : 0);
    }
    if (contentChecksum) {
      need(4);
      pos += 4;
    }
  }
  return Buffer.from(out.bytes.buffer, 0, out.length);
}

/** Lets KafkaJS read LZ4-compressed record batches (it never writes them here). */
export function registerLz4() {
  CompressionCodecs[CompressionTypes.LZ4] = () => ({
    async compress() {
      throw new Error('lz4: compression is not implemented here (produce uncompressed)');
    },
    async decompress(buffer) {
      return lz4Decompress(buffer);
    },
  });
}
