"""AWS for tests: moto in server mode on 127.0.0.1, behind a small HTTP proxy that injects the errors moto does not
model, so the real boto3 parses real AWS error responses.

- :class:`MotoAws` runs ``moto.server.ThreadedMotoServer`` (EC2 instance-type validation on) and a
  :class:`FaultProxy` in front of it; boto3 clients talk HTTP to the proxy.
- The proxy forwards every request unchanged and records it (service, action, form or JSON parameters). It can
  answer ``CreateFleet`` the way EC2 answers an ``instant`` fleet it cannot fill: HTTP 200 with an ``errorSet`` item
  (``InsufficientInstanceCapacity``, ``VcpuLimitExceeded``, ...) per failing override, the failing overrides removed
  from what moto launches; and it can answer any action with an EC2-style XML error response (HTTP 4xx/5xx).
- :func:`build_world` creates what an EKS cluster has: a VPC, subnets in two zones, a security group and the public
  SSM parameter of the accelerated AMI (once per server), and per call a fresh EKS cluster and interruption queue.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import os
import threading
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

os.environ.setdefault("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")

import boto3
from moto import settings as moto_settings
from moto.server import ThreadedMotoServer

moto_settings.EC2_ENABLE_INSTANCE_TYPE_VALIDATION = True
logging.getLogger("werkzeug").setLevel(logging.ERROR)

REGION = "us-east-1"
ACCOUNT = "123456789012"
CLUSTER = "gpu-cluster"
QUEUE = "gpuscale-interruptions"
ACCESS_KEY = "AKIAGPUSCALETESTKEY1"
SECRET_KEY = "gpuscale/test/secret/key/that/must/never/leak"
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
Reply = tuple[int, list[tuple[str, str]], bytes]
"""An HTTP answer: status, headers, body."""


@dataclass(frozen=True)
class Recorded:
    """One request the proxy saw."""

    action: str
    params: dict[str, Any]
    service: str = ""
    """The signing name from the Authorization header's credential scope (ec2, eks, ssm, sqs, autoscaling)."""


@dataclass
class FaultProxy:
    """An HTTP proxy in front of moto that records requests and injects AWS error responses."""

    upstream: tuple[str, int]
    fleet_errors: dict[tuple[str, str | None], tuple[str, str]] = field(default_factory=dict)
    """(instance type or ``*`` for any, availability zone or None for any) -> (error code, message) for the
    CreateFleet overrides that fail."""
    action_errors: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    """action -> (HTTP status, code, message): answer that action with an EC2 XML error."""
    requests: list[Recorded] = field(default_factory=list)
    _server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, out = proxy.handle(self.command, self.path, dict(self.headers.items()), body)
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def reset(self) -> None:
        self.fleet_errors.clear()
        self.action_errors.clear()
        self.requests.clear()

    def actions(self) -> list[str]:
        return [r.action for r in self.requests]

    def calls(self, action: str) -> list[dict[str, Any]]:
        return [r.params for r in self.requests if r.action == action]

    # --- request handling ----------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        target = headers.get("X-Amz-Target") or headers.get("x-amz-target") or ""
        if target:  # JSON protocol (SQS, SSM)
            action = target.rsplit(".", 1)[-1]
            params: dict[str, Any] = json.loads(body or b"{}")
        elif path.startswith("/clusters") or "eks" in headers.get("Authorization", ""):
            action = f"{method} {path.split('?')[0]}"
            params = json.loads(body) if body else {}
        else:
            form = urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
            params = dict(form)
            action = params.get("Action", f"{method} {path}")
        scope = headers.get("Authorization", "").split("Credential=", 1)[-1].split(",", 1)[0].split("/")
        self.requests.append(Recorded(action, params, scope[3] if len(scope) > 3 else ""))
        if action in self.action_errors:
            status, code, message = self.action_errors[action]
            return status, [("Content-Type", "text/xml")], self._error_xml(code, message)
        if action == "CreateFleet" and self.fleet_errors:
            return self._create_fleet(path, headers, body)
        return self._forward(method, path, headers, body)

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            fwd = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "connection")}
            conn.request(method, path, body=body, headers=fwd)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    @staticmethod
    def _error_xml(code: str, message: str) -> bytes:
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
        ).encode()

    def _failing(self, instance_type: str, zone: str) -> tuple[str, str] | None:
        errors = self.fleet_errors
        return errors.get((instance_type, zone)) or errors.get((instance_type, None)) or errors.get(("*", None))

    def _create_fleet(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        form = urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
        prefix = "LaunchTemplateConfigs.1.Overrides."
        overrides: dict[str, dict[str, str]] = {}
        for k, v in form:
            if k.startswith(prefix):
                n, _, attr = k[len(prefix) :].partition(".")
                overrides.setdefault(n, {})[attr] = v
        spot = dict(form).get("TargetCapacitySpecification.DefaultTargetCapacityType") == "spot"
        template = dict(form).get("LaunchTemplateConfigs.1.LaunchTemplateSpecification.LaunchTemplateId", "")
        bad = {n: e for n, o in overrides.items() if (e := self._failing(o["InstanceType"], o["AvailabilityZone"]))}
        errors = "".join(
            "<item><launchTemplateAndOverrides><launchTemplateSpecification>"
            f"<launchTemplateId>{template}</launchTemplateId><version>1</version></launchTemplateSpecification>"
            f"<overrides><instanceType>{overrides[n]['InstanceType']}</instanceType>"
            f"<subnetId>{overrides[n]['SubnetId']}</subnetId>"
            f"<availabilityZone>{overrides[n]['AvailabilityZone']}</availabilityZone></overrides>"
            f"</launchTemplateAndOverrides><lifecycle>{'spot' if spot else 'on-demand'}</lifecycle>"
            f"<errorCode>{code}</errorCode><errorMessage>{message}</errorMessage></item>"
            for n, (code, message) in sorted(bad.items())
        )
        good = [n for n in sorted(overrides) if n not in bad]
        if not good:
            xml = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<CreateFleetResponse xmlns="{EC2_NS}">'
                f"<requestId>{uuid.uuid4()}</requestId><fleetId>fleet-{uuid.uuid4()}</fleetId>"
                f"<errorSet>{errors}</errorSet><fleetInstanceSet/></CreateFleetResponse>"
            )
            return 200, [("Content-Type", "text/xml")], xml.encode()
        kept: list[tuple[str, str]] = []
        for k, v in form:
            if k.startswith(prefix):
                n, _, attr = k[len(prefix) :].partition(".")
                if n in bad:
                    continue
                k = f"{prefix}{good.index(n) + 1}.{attr}"
            kept.append((k, v))
        status, hdrs, out = self._forward("POST", path, headers, urllib.parse.urlencode(kept).encode())
        if errors and status == 200:
            out = out.replace(
                b"</CreateFleetResponse>", f"<errorSet>{errors}</errorSet></CreateFleetResponse>".encode()
            )
        return status, hdrs, out


class MotoAws:
    """moto's server plus the fault proxy, both on 127.0.0.1 free ports."""

    def __init__(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.proxy = FaultProxy(self.server.get_host_and_port()).start()
        self._session = boto3.session.Session(
            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
        )
        self._clients: dict[str, Any] = {}
        self._image = ""

    def session(self) -> boto3.session.Session:
        return self._session

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self._session.client(service, endpoint_url=self.proxy.url)
        return self._clients[service]

    def image_id(self) -> str:
        """One of moto's Amazon AMIs (looked up once: DescribeImages is slow in moto)."""
        if not self._image:
            self._image = self.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        return self._image

    def reset(self) -> None:
        host, port = self.server.get_host_and_port()
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("POST", "/moto-api/reset")
        conn.getresponse().read()
        conn.close()
        self.proxy.reset()

    def stop(self) -> None:
        self.proxy.stop()
        self.server.stop()


@dataclass(frozen=True)
class World:
    """What :func:`build_world` created. Each world has its own cluster and queue, so tests sharing one moto server
    never see each other's instances (the provider lists by its cluster tag)."""

    cluster: str
    queue: str
    subnets: dict[str, str]
    """availability zone -> subnet id."""
    security_group: str
    image_id: str
    queue_url: str


@dataclass(frozen=True)
class _Network:
    subnets: dict[str, str]
    security_group: str


_NETWORKS: dict[int, _Network] = {}
_SHARED: list[MotoAws] = []


def shared_moto() -> MotoAws:
    """One moto server (and proxy) for the whole test session; its threads are daemons."""
    if not _SHARED:
        _SHARED.append(MotoAws())
    return _SHARED[0]


def seed_public_parameter(name: str, value: str) -> None:
    """Put an AWS public parameter (``/aws/service/...``, which PutParameter refuses) into moto's SSM."""
    from moto.ssm.models import Parameter, ssm_backends

    params = ssm_backends[ACCOUNT][REGION]._parameters
    if params.get(name):
        return
    params[name].append(
        Parameter(  # type: ignore[abstract]  # moto marks CloudFormationModel methods @abstractmethod without ABCMeta
            account_id=ACCOUNT,
            name=name,
            value=value,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=datetime.now(UTC),
            version=1,
            data_type="aws:ec2:image",
        )
    )


def _network(aws: MotoAws) -> _Network:
    """A VPC with subnets in two zones, a security group and the AMI parameters: made once per moto server."""
    if id(aws) not in _NETWORKS:
        ec2 = aws.client("ec2")
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnets = {
            az: ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=az)["Subnet"]["SubnetId"]
            for az, cidr in (("us-east-1a", "10.0.0.0/17"), ("us-east-1b", "10.0.128.0/17"))
        }
        sg = ec2.create_security_group(GroupName="nodes", Description="gpu nodes", VpcId=vpc)["GroupId"]
        for arch in ("x86_64", "arm64"):
            seed_public_parameter(
                f"/aws/service/eks/optimized-ami/1.31/amazon-linux-2023/{arch}/nvidia/recommended/image_id",
                aws.image_id(),
            )
        _NETWORKS[id(aws)] = _Network(subnets, sg)
    return _NETWORKS[id(aws)]


def build_world(aws: MotoAws, *, queue: bool = True) -> World:
    """A fresh EKS cluster (Kubernetes 1.31) with its own interruption queue, in the shared network; the proxy's
    faults and records are cleared."""
    net = _network(aws)
    suffix = uuid.uuid4().hex[:8]
    cluster = f"{CLUSTER}-{suffix}"
    aws.client("eks").create_cluster(
        name=cluster,
        version="1.31",
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks",
        resourcesVpcConfig={"subnetIds": list(net.subnets.values()), "securityGroupIds": [net.security_group]},
    )
    name = f"{QUEUE}-{suffix}"
    url = aws.client("sqs").create_queue(QueueName=name)["QueueUrl"] if queue else ""
    aws.proxy.reset()
    return World(cluster, name, dict(net.subnets), net.security_group, aws.image_id(), url)


def ec2_event(detail_type: str, instance_id: str, *, state: str = "", at: str = "2026-11-24T21:00:00Z") -> str:
    """An EventBridge EC2 event as it arrives in the SQS queue."""
    detail: dict[str, str] = {"instance-id": instance_id}
    if detail_type.startswith("EC2 Spot"):
        detail["instance-action"] = "terminate"
    if state:
        detail["state"] = state
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": ACCOUNT,
            "time": at,
            "region": REGION,
            "resources": [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance_id}"],
            "detail": detail,
        }
    )
