# nsightful MCP server. Build: docker build -t nsightful .
# Run:   docker run -i --rm -v "$PWD:/profiles" nsightful
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY profiles profiles
COPY tools tools
COPY server server
COPY resources resources
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 nsightful
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER nsightful
ENV NSIGHTFUL_CACHE_DIR=/home/nsightful/.cache/nsightful
WORKDIR /profiles
ENTRYPOINT ["nsightful", "serve", "--root", "/profiles"]
