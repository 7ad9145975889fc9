"""Handlers from Ray Serve's documents, the import changed, shared by the unit tests (a replica
app) and the integration tests (``serve.run``, which ships them by value)."""

from __future__ import annotations

import asyncio
from typing import AsyncGenerator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from modelplex import serve


# Ray's Getting Started.
@serve.deployment
class Translator:
    def translate(self, text: str) -> str:
        return {"Hello world!": "Bonjour monde!"}.get(text, text[::-1])

    async def __call__(self, http_request: Request) -> str:
        english_text: str = await http_request.json()
        return self.translate(english_text)


# Ray's streaming guide.
@serve.deployment
class StreamingResponder:
    async def generate_numbers(self, max: int) -> AsyncGenerator[str, None]:
        for i in range(max):
            yield str(i)
            await asyncio.sleep(0.01)

    def __call__(self, request: Request) -> StreamingResponse:
        max = request.query_params.get("max", "25")
        gen = self.generate_numbers(int(max))
        return StreamingResponse(gen, status_code=200, media_type="text/plain")
