"""The four special tokens of the niels_gpt chat format (fixed by the cache contract) and the roles they open.
The encoder never produces them from text (a typed one stays text); only `render_chat` emits them."""

SPECIAL_SUFFIX = "84a5023f67d74cf29cc4001becde983c"

SYS_TOKEN = f"<|ngpt_sys_{SPECIAL_SUFFIX}|>"
USR_TOKEN = f"<|ngpt_usr_{SPECIAL_SUFFIX}|>"
ASST_TOKEN = f"<|ngpt_asst_{SPECIAL_SUFFIX}|>"
EOT_TOKEN = f"<|ngpt_eot_{SPECIAL_SUFFIX}|>"

# Short names used in meta.json ("special_token_ids": {"sys": .., "usr": .., "asst": .., "eot": ..}).
SPECIAL_TOKENS: dict[str, str] = {"sys": SYS_TOKEN, "usr": USR_TOKEN, "asst": ASST_TOKEN, "eot": EOT_TOKEN}

# Message role -> short name of the sentinel that opens it.
ROLE_TO_SPECIAL: dict[str, str] = {"system": "sys", "user": "usr", "assistant": "asst"}
ROLES: tuple[str, ...] = tuple(ROLE_TO_SPECIAL)
