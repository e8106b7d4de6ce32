"""The endpoint URLs batch lines target, and the aliases real files use for them: the one spelling of each.

Azure OpenAI's batch files (and its docs) write a line's `url` and a batch's `endpoint` without the version
prefix (`/chat/completions`); such a file is the same request, so the line checker and batch create take the
alias and store the canonical URL. Which protocol serves which endpoint is storage/protocols.py's.
"""

from __future__ import annotations

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
RESPONSES_URL = "/v1/responses"
MODERATIONS_URL = "/v1/moderations"
MESSAGES_URL = "/v1/messages"

# Azure OpenAI's spelling of OpenAI's batch endpoints.
ALIASES = {url.removeprefix("/v1"): url for url in (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL)}


def canonical_url(url: str) -> str:
    """The endpoint `url` names: an alias as its canonical URL, anything else as it is."""
    return ALIASES.get(url, url)
