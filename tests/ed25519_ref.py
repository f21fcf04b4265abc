"""An independent, lax Ed25519 for tests: the curve's arithmetic by other formulas than
processor/trust/ed25519.py's (affine additions, projective scalar multiplication), its torsion
points derived from the curve itself, and forgeries that satisfy the cofactorless
equation R = [S]B - [k]A, which is all OpenSSL checks after decoding. Never for use.
"""

import hashlib
from collections.abc import Iterator
from functools import cache

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P

Affine = tuple[int, int]
IDENTITY: Affine = (0, 1)


def _inv(x: int) -> int:
    return pow(x, P - 2, P)


def add(a: Affine, b: Affine) -> Affine:
    (x1, y1), (x2, y2) = a, b
    t = D * x1 * x2 * y1 * y2 % P
    return ((x1 * y2 + x2 * y1) * _inv(1 + t) % P, (y1 * y2 + x1 * x2) * _inv(1 - t) % P)


def neg(a: Affine) -> Affine:
    return ((-a[0]) % P, a[1])


def _add_projective(p1: tuple[int, int, int], p2: tuple[int, int, int]) -> tuple[int, int, int]:
    # add-2008-bbjlp (projective X:Y:Z, a = -1): no inversion, unlike `add`.
    x1, y1, z1 = p1
    x2, y2, z2 = p2
    a = z1 * z2 % P
    b = a * a % P
    c = x1 * x2 % P
    d = y1 * y2 % P
    e = D * c * d % P
    f, g = (b - e) % P, (b + e) % P
    return (a * f * ((x1 + y1) * (x2 + y2) - c - d) % P, a * g * (d + c) % P, f * g % P)


def mul(n: int, a: Affine) -> Affine:
    out, point = (0, 1, 1), (a[0], a[1], 1)
    while n:
        if n & 1:
            out = _add_projective(out, point)
        point = _add_projective(point, point)
        n >>= 1
    zi = _inv(out[2])
    return (out[0] * zi % P, out[1] * zi % P)


def on_curve(a: Affine) -> bool:
    x, y = a
    return (-x * x + y * y - 1 - D * x * x * y * y) % P == 0


def decode_lax(raw: bytes) -> Affine | None:
    """The point as ref10/OpenSSL reads it: y taken mod p, the sign bit picks x, no
    canonical checks; None off the curve."""
    n = int.from_bytes(raw, "little")
    y, sign = (n & ((1 << 255) - 1)) % P, n >> 255
    x2 = (y * y - 1) * _inv(D * y * y + 1) % P
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * pow(2, (P - 1) // 4, P) % P
    if (x * x - x2) % P:
        return None
    if x & 1 != sign:
        x = (-x) % P
    return (x, y)


def encode(a: Affine) -> bytes:
    return (a[1] | (a[0] & 1) << 255).to_bytes(32, "little")


BASE: Affine = decode_lax((4 * _inv(5) % P).to_bytes(32, "little"))  # type: ignore[assignment]


def order(a: Affine) -> int:
    """The order of a point of the 8-torsion (1, 2, 4 or 8)."""
    for n in (1, 2, 4, 8):
        if mul(n, a) == IDENTITY:
            return n
    raise ValueError("not a torsion point")


@cache
def torsion_points() -> list[Affine]:
    """The eight points of order dividing 8, as multiples of one of order 8, found as
    [L]Q for the first point Q (by y = 2, 3, ...) whose torsion part has order 8."""
    y = 2
    while True:
        q = decode_lax(y.to_bytes(32, "little"))
        if q is not None:
            t = mul(L, q)
            if mul(4, t) != IDENTITY:
                return [mul(k, t) for k in range(8)]
        y += 1


@cache
def torsion_encodings() -> list[tuple[bytes, int, str]]:
    """Every 32-byte string that decodes (laxly) to a torsion point: (bytes, the point's
    order, its form: "canonical", or how it is not)."""
    out = []
    for point in torsion_points():
        x, y = point
        for y_bits in (y, y + P):
            if y_bits >= 1 << 255:
                continue
            for sign in (0, 1):
                raw = (y_bits | sign << 255).to_bytes(32, "little")
                if decode_lax(raw) != point:
                    continue
                flaws = ["y + p"] if y_bits != y else []
                if sign != x & 1:
                    flaws.append("x = 0 with the sign bit set")
                out.append((raw, order(point), ", ".join(flaws) or "canonical"))
    return out


def challenge(r: bytes, a: bytes, message: bytes) -> int:
    return int.from_bytes(hashlib.sha512(r + a + message).digest(), "little") % L


def lax_verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """RFC 8032's cofactorless check with no canonical or small-order checks: S < 2^256,
    any A and R that decode, R compared as bytes with the encoding of [S]B - [k]A."""
    a = decode_lax(public)
    if a is None or len(signature) != 64:
        return False
    r, s = signature[:32], int.from_bytes(signature[32:], "little")
    k = challenge(r, public, message)
    return encode(add(mul(s, BASE), neg(mul(k, a)))) == r


def forge_small_order(public: bytes, message: bytes) -> bytes | None:
    """A signature with S = 0 that `lax_verify` accepts under a small-order key without
    its private key: R = -[k]A for one of the torsion encodings as R; None when none
    of them fits this message."""
    a = decode_lax(public)
    if a is None or mul(8, a) != IDENTITY:
        return None
    for r, _, _ in torsion_encodings():
        # [k]A = [k mod 8]A for A of order dividing 8: no long scalar multiplication.
        if encode(neg(mul(challenge(r, public, message) % 8, a))) == r:
            return r + bytes(32)
    return None


def scalar(seed: bytes) -> int:
    h = bytearray(hashlib.sha512(seed).digest()[:32])
    h[0] &= 248
    h[31] &= 127
    h[31] |= 64
    return int.from_bytes(h, "little")


def public_key(seed: bytes) -> bytes:
    return encode(mul(scalar(seed), BASE))


def sign_with_identity_r(seed: bytes, message: bytes) -> bytes:
    """The key holder's signature with R = the identity (nonce 0): S = k * a."""
    r = encode(IDENTITY)
    k = challenge(r, public_key(seed), message)
    return r + (k * scalar(seed) % L).to_bytes(32, "little")


def mixed_order_key(seed: bytes, torsion: Affine) -> bytes:
    return encode(add(mul(scalar(seed), BASE), torsion))


def sign_mixed(seed: bytes, torsion: Affine, message: bytes) -> Iterator[bytes]:
    """Signatures by the holder of `seed` that `lax_verify` accepts under the mixed-order
    key [a]B + T: R = [r]B for nonces r = 1, 2, ... whose challenge kills T."""
    public = mixed_order_key(seed, torsion)
    a = scalar(seed)
    for r in range(1, 1000):
        big_r = encode(mul(r, BASE))
        k = challenge(big_r, public, message)
        if mul(k, torsion) == IDENTITY:
            yield big_r + ((r + k * a) % L).to_bytes(32, "little")
