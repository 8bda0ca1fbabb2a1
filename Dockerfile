# The gpumgr image: the agent (`gpumgr run`), the extender (`gpumgr extender`) and the vCUDA shim that the agent
# installs on each node for fractional containers (--shim-source, default /usr/local/lib/gpumgr/libvcuda.so).
# Build: docker build -t ghcr.io/gpumgr/gpumgr:0.1.0 .
FROM python:3.11-slim AS shim
RUN apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev && rm -rf /var/lib/apt/lists/*
COPY vcuda /src/vcuda
RUN make -C /src/vcuda build/libvcuda.so build/libvcuda-driver.so

FROM python:3.11-slim
COPY pyproject.toml README.md /src/
COPY gpumgr /src/gpumgr
RUN pip install --no-cache-dir /src && rm -rf /src
COPY --from=shim /src/vcuda/build/libvcuda.so /src/vcuda/build/libvcuda-driver.so /usr/local/lib/gpumgr/
ENTRYPOINT ["gpumgr"]
CMD ["run"]
