# The gpuscale controller image: docker build -t gpuscale/controller:0.1.0 .
# Runs `gpuscale controller` (deploy/kubernetes/base/deployment.yaml passes the arguments) as a non-root user.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[kube,linode]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "gpuscale[kube,linode]" && rm -rf /wheels
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["gpuscale"]
CMD ["controller", "--provider=linode", "--leader-elect"]
