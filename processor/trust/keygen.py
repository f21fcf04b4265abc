"""New keys: a key's two halves, and a whole keyring of the standard principals.

The keyring's entry is what a worker verifies with (an Ed25519 public key, or the HMAC
secret), the signing key what its producer signs with. `runstate keys` writes both.
"""

import secrets

from processor.trust.keyring import KeyEntry, Keyring, SigningKey
from processor.trust.signatures import Algorithm, ed25519_public_key, new_ed25519_private_key

#: The standard principals: the runtime, a tool executor, a model, an approver.
STANDARD_PRINCIPALS = {
    "runtime": ("runtime", "runtime"),
    "tool": ("tool:get_status", "tool_executor"),
    "model": ("model:planner", "model"),
    "approver": ("approver:oncall", "approver"),
}
#: The operator's key of a generated keyring: authority runtime (a machine's default
#: `migrate_authorities`) and operator authority (it signs machine versions).
OPERATOR_KEY_ID = "operator"
OPERATOR_PRINCIPAL = ("operator", "runtime")
#: The workers' own key of a generated keyring (processor: deadlines and the messages
#: runs exchange).
PROCESSOR_KEY_ID = "worker"
PROCESSOR_PRINCIPAL = ("worker", "runtime")


def new_key(
    key_id: str, algorithm: Algorithm, source: str, authority: str, **limits: object
) -> tuple[KeyEntry, SigningKey]:
    """A fresh key: the entry a keyring holds and the signing key its producer holds."""
    if algorithm is Algorithm.ED25519:
        private = new_ed25519_private_key()
        signing = SigningKey(key_id=key_id, algorithm=algorithm, private_key=private)
        verifying = {"public_key": ed25519_public_key(private)}
    else:
        secret = secrets.token_hex(32)
        signing = SigningKey(key_id=key_id, algorithm=algorithm, secret=secret)
        verifying = {"secret": secret}
    entry = KeyEntry.model_validate(
        {"algorithm": algorithm, "source": source, "authority": authority, **verifying, **limits}
    )
    return entry, signing


def generate_keys(algorithm: Algorithm) -> tuple[Keyring, dict[str, SigningKey]]:
    """A fresh keyring with one key per standard principal (key id = its name), an
    operator key (`OPERATOR_KEY_ID`) and the workers' key (`PROCESSOR_KEY_ID`), and each
    key's signing half."""
    made = {
        key_id: new_key(key_id, algorithm, source, authority)
        for key_id, (source, authority) in STANDARD_PRINCIPALS.items()
    }
    made[OPERATOR_KEY_ID] = new_key(OPERATOR_KEY_ID, algorithm, *OPERATOR_PRINCIPAL, operator=True)
    made[PROCESSOR_KEY_ID] = new_key(
        PROCESSOR_KEY_ID, algorithm, *PROCESSOR_PRINCIPAL, processor=True
    )
    keyring = Keyring(keys={key_id: entry for key_id, (entry, _) in made.items()})
    return keyring, {key_id: signing for key_id, (_, signing) in made.items()}


def generate_keyring() -> Keyring:
    """A fresh HMAC keyring of the standard principals: it signs as any of them (the
    demo's and the tests' producer)."""
    return generate_keys(Algorithm.HMAC_SHA256)[0]
