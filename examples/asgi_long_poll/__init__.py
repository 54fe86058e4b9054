"""Long polls on Starlette under uvicorn (see README.md)."""
