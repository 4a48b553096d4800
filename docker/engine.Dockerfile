# quotastream engine: Python 3.11 + Java 17 (Spark) + the package. Built by docker-compose.yml.
FROM python:3.11-slim-bookworm

# JAVA_HOME is a fixed link to wherever the JDK landed (java-17-openjdk-amd64, -arm64, ...),
# found from the installed `java` by docker/java-home: the same file builds on any architecture.
COPY docker/java-home /usr/local/bin/java-home
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "$(sh /usr/local/bin/java-home)" /usr/lib/jvm/quotastream-java \
    && /usr/lib/jvm/quotastream-java/bin/java -version
ENV JAVA_HOME=/usr/lib/jvm/quotastream-java \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY quotastream ./quotastream
COPY state ./state
COPY streaming ./streaming
# The engine extra: the base install is only the agent client (docs/agents.md).
RUN pip install '.[engine]'
COPY conf ./conf

# The exporter (metrics.port); bind it with QUOTASTREAM_METRICS__HOST=0.0.0.0.
EXPOSE 9464
ENTRYPOINT ["quotastream"]
CMD ["run", "--engine-config", "conf/engine.yaml", "--no-embedded", "--no-simulate"]
