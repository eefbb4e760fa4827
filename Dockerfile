# stallhound MCP server. Build: docker build -t stallhound .
# Run:   docker run -i --rm -v "$PWD:/profiles:ro" stallhound            (stdio)
#        docker run -d --rm -p 127.0.0.1:8000:8000 -v "$PWD:/profiles:ro" -e STALLHOUND_TOKEN=... stallhound \
#          --transport http --host 0.0.0.0 --port 8000                             (streamable HTTP with a token)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 stallhound
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER stallhound
ENV STALLHOUND_CACHE_DIR=/home/stallhound/.cache/stallhound
WORKDIR /profiles
ENTRYPOINT ["stallhound", "serve", "--root", "/profiles"]
