# The worker and the demo, for docker-compose.yml on a machine with a Docker engine.
FROM python:3.11-slim
WORKDIR /srv/tickwheel
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY app ./app
COPY tables ./tables
# The exact set CI tests (constraints.txt); a user of its own, owning only its data.
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --system --uid 10001 --no-create-home --home-dir /data tickwheel \
    && mkdir -p /data \
    && chown tickwheel /data
ENV TICKWHEEL_DATA_DIR=/data \
    TICKWHEEL_WEB_PORT=9400 \
    TICKWHEEL_WEB_HOST=0.0.0.0
VOLUME ["/data"]
USER 10001
EXPOSE 9400
# Liveness, not readiness: a broker outage makes /readyz 503, not the process unhealthy.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9400/livez', timeout=2)"]
CMD ["tickwheel", "worker"]
