# The worker and the demo, for docker-compose.yml on a machine with a Docker engine.
FROM python:3.11-slim
WORKDIR /srv/tickwheel
COPY pyproject.toml README.md ./
COPY app ./app
COPY tables ./tables
RUN pip install --no-cache-dir .
ENV TICKWHEEL_DATA_DIR=/data
CMD ["tickwheel", "worker"]
