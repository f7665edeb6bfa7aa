"""OpenAI's Responses API (/v1/responses): protocol (request fields) -> serving (onto the chat jobs) -> router.

Not to be confused with gateway/replies/bodies.py, which shapes chat completion response bodies.
"""
