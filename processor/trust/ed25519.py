"""The strict Ed25519 rule: which public keys a keyring holds and which signatures count.

Ed25519 verifiers disagree at the edges (RFC 8032 leaves them open): OpenSSL, and so
`cryptography`, accepts the identity point as a public key, and under it the signature
R = identity, S = 0 verifies every message; libsodium's `crypto_sign_verify_detached`
refuses it. A key a verifier treats differently from another is a key someone can sign
with, or a record two auditors decide differently. So every verifier here applies one
rule, libsodium's, and refuses at keyring load what would make verifiers disagree
(mixed-order keys too, which libsodium takes):

- a public key is refused unless its 32 bytes are the canonical encoding (y < p, and
  x = 0 only with the sign bit clear) of a point on the curve of the prime-order
  subgroup other than the identity: so no small-order (8-torsion) point in any encoding,
  no point with a small-order component (mixed order, which cofactored and cofactorless
  verifiers decide differently), no point off the curve;
- a signature is refused when S >= L, or when R's encoding (sign bit aside) is one of a
  small-order point (libsodium's `ge25519_has_small_order` list);
- what is left is verified by `cryptography` (R == [S]B - [k]A, byte for byte).

Plain integer arithmetic on the curve (RFC 8032 section 5.1): slow (milliseconds per
key) but only at keyring load; a signature's checks are byte comparisons.
"""

from functools import lru_cache

#: The field prime and the prime order of the base point's subgroup.
P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)
_Y_MASK = (1 << 255) - 1

#: The y coordinates (the low 255 bits of an encoding, the sign bit is x's) of the eight
#: points of order 1, 2, 4 and 8, and the two of them that have a second encoding
#: y + p < 2^255: libsodium's `ge25519_has_small_order` list. tests/unit/test_ed25519.py
#: derives them from the curve.
SMALL_ORDER_Y = frozenset(
    {
        0,  # (+-sqrt(-1), 0), order 4
        1,  # the identity (0, 1), order 1
        P - 1,  # (0, -1), order 2
        0x05FC536D880238B13933C6D305ACDFD5F098EFF289F4C345B027B2C28F95E826,  # order 8
        0x7A03AC9277FDC74EC6CC392CFA53202A0F67100D760B3CBA4FD84D3D706A17C7,  # order 8
        P,  # 0 again, not canonical
        P + 1,  # 1 again, not canonical
    }
)

Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z
IDENTITY: Point = (0, 1, 1, 0)


def _add(a: Point, b: Point) -> Point:
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    m = (y1 - x1) * (y2 - x2) % P
    n = (y1 + x1) * (y2 + x2) % P
    c = t1 * 2 * D * t2 % P
    dd = z1 * 2 * z2 % P
    e, f, g, h = n - m, dd - c, dd + c, n + m
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _multiply(scalar: int, point: Point) -> Point:
    out = IDENTITY
    while scalar > 0:
        if scalar & 1:
            out = _add(out, point)
        point = _add(point, point)
        scalar >>= 1
    return out


def _is_identity(point: Point) -> bool:
    x, y, z, _ = point
    return x % P == 0 and (y - z) % P == 0


def decode_point(raw: bytes) -> Point | str:
    """The point a 32-byte encoding names, or why it names none (RFC 8032 5.1.3, with
    the canonical checks RFC 8032 makes optional made mandatory)."""
    if len(raw) != 32:
        return f"{len(raw)} bytes, not 32"
    encoded = int.from_bytes(raw, "little")
    y, sign = encoded & _Y_MASK, encoded >> 255
    if y >= P:
        return "not canonical: its y coordinate is not below 2^255 - 19"
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x = u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P) % P
    if v * x * x % P == (-u) % P:
        x = x * SQRT_M1 % P
    if v * x * x % P != u:
        return "not a point of the curve"
    if x == 0 and sign:
        return "not canonical: x is 0 and the sign bit is set"
    if x & 1 != sign:
        x = P - x
    return (x, y, 1, x * y % P)


def public_key_problem(raw: bytes) -> str | None:
    """Why these bytes are no Ed25519 public key a keyring may hold, or None."""
    if len(raw) == 32 and int.from_bytes(raw, "little") & _Y_MASK in SMALL_ORDER_Y:
        return "a point of small order: anyone can make signatures that verify under it"
    point = decode_point(raw)
    if isinstance(point, str):
        return point
    # SMALL_ORDER_Y holds every point of small order: this is the rule the list stands for.
    if _is_identity(_multiply(8, point)):
        return "a point of small order: anyone can make signatures that verify under it"
    if not _is_identity(_multiply(L, point)):
        return (
            "not in the prime-order subgroup (it has a small-order component, which "
            "Ed25519 verifiers treat differently)"
        )
    return None


@lru_cache(maxsize=1024)
def public_key_problem_hex(public_key_hex: str) -> str | None:
    """`public_key_problem` of a key as a keyring holds it (hex), once per key."""
    try:
        raw = bytes.fromhex(public_key_hex)
    except ValueError:
        return "not hex"
    return public_key_problem(raw)


def signature_problem(signature: bytes) -> str | None:
    """Why a signature is refused before any arithmetic, or None: its length, S >= L,
    or R of small order."""
    if len(signature) != 64:
        return f"{len(signature)} bytes, not 64"
    if int.from_bytes(signature[32:], "little") >= L:
        return "S is not below L (not canonical)"
    if int.from_bytes(signature[:32], "little") & _Y_MASK in SMALL_ORDER_Y:
        return "R is a point of small order"
    return None
