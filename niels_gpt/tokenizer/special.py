"""The four special tokens of the niels_gpt chat format, and the roles they stand for.

The strings are fixed by the cache contract. They are sentencepiece *control* symbols: the encoder
never produces them from text, so a user who types one of these strings gets ordinary text pieces,
never a special id. Only `render_chat` (and code that asks for the ids by role) emits them.
"""

SPECIAL_SUFFIX = "84a5023f67d74cf29cc4001becde983c"

SYS_TOKEN = f"<|ngpt_sys_{SPECIAL_SUFFIX}|>"
USR_TOKEN = f"<|ngpt_usr_{SPECIAL_SUFFIX}|>"
ASST_TOKEN = f"<|ngpt_asst_{SPECIAL_SUFFIX}|>"
EOT_TOKEN = f"<|ngpt_eot_{SPECIAL_SUFFIX}|>"

# Short names used in meta.json ("special_token_ids": {"sys": .., "usr": .., "asst": .., "eot": ..}).
SPECIAL_TOKENS: dict[str, str] = {
    "sys": SYS_TOKEN,
    "usr": USR_TOKEN,
    "asst": ASST_TOKEN,
    "eot": EOT_TOKEN,
}

# Message role -> short name of the sentinel that opens it.
ROLE_TO_SPECIAL: dict[str, str] = {"system": "sys", "user": "usr", "assistant": "asst"}
ROLES: tuple[str, ...] = tuple(ROLE_TO_SPECIAL)
