"""`biglm serve`: an OpenAI-compatible HTTP server for BiGLM.

Layers: ``protocol`` (the wire format and the one request -> `DecodingConfig` mapping) ->
``scheduler`` (the engine thread that batches requests between decoding steps, with a bounded
queue) -> ``app`` (the FastAPI app: endpoints, streaming, limits) -> ``cli`` (`biglm serve`, uvicorn
with a drain-then-cancel shutdown). Serving imports generation and checkpoint loading, never training.
"""
