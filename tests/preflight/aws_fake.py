"""A local fake of the AWS calls moto 5.2.5 cannot answer for a preflight, on 127.0.0.1.

- Service Quotas GetServiceQuota for service code ec2: moto implements Service Quotas for
  ``vpc`` only (moto/servicequotas/models.py: any other service code raises
  NoSuchResourceException), so EC2's vCPU quotas come from here.
- SSM GetParameter for the public /aws/service/... image parameters: moto has none of the
  Deep Learning AMI parameters and refuses to create a name under /aws/ (AccessDenied:
  "No access to reserved parameter name"), as AWS does.

- Service Quotas RequestServiceQuotaIncrease (``--request-quota``): moto 5.2.5 has no such
  operation (moto/servicequotas/responses.py answers ListAWSDefaultServiceQuotas and
  GetServiceQuota only). The answer is RequestServiceQuotaIncreaseResponse.RequestedQuota
  of RequestedServiceQuotaChange (Id, CaseId, ServiceCode, QuotaCode, QuotaName,
  DesiredValue, Status PENDING, Created, QuotaArn, Unit, ...; Status from its RequestStatus
  enum); a second request for the same quota while one is open is
  ResourceAlreadyExistsException, one of the operation's errors in the same model.

All speak JSON 1.1 (POST /, ``X-Amz-Target: <targetPrefix>.<Operation>``), the shapes
botocore's own service models define (botocore/data/service-quotas/2019-06-24/service-2.json:
GetServiceQuotaResponse.Quota of ServiceQuota; botocore/data/ssm/2014-11-06/service-2.json:
GetParameterResult.Parameter), read from the copy in this repo's .venv, 2026-12-05;
tests/preflight/test_aws_preflight.py checks every key answered here is a member of those
shapes. Errors are ``{"__type": Code, "message": ...}`` with HTTP 400, as botocore parses
JSON protocol errors. Every request is counted by its target.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

QUOTA_NAMES = {
    "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-3819A6DF": "All G and VT Spot Instance Requests",
    "L-417A185B": "Running On-Demand P instances",
    "L-7212CCBC": "All P Spot Instance Requests",
}


def quota_answer(code: str, value: float, region: str = "us-east-1") -> dict[str, Any]:
    """GetServiceQuotaResponse for one EC2 quota (vCPUs)."""
    return {
        "Quota": {
            "ServiceCode": "ec2",
            "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
            "QuotaArn": f"arn:aws:servicequotas:{region}:123456789012:ec2/{code}",
            "QuotaCode": code,
            "QuotaName": QUOTA_NAMES.get(code, code),
            "Value": value,
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
        }
    }


def parameter_answer(name: str, value: str, region: str = "us-east-1") -> dict[str, Any]:
    """GetParameterResult for one public parameter."""
    return {
        "Parameter": {
            "Name": name,
            "Type": "String",
            "Value": value,
            "Version": 1,
            "LastModifiedDate": 1765000000.0,
            "ARN": f"arn:aws:ssm:{region}::parameter{name}",
            "DataType": "text",
        }
    }


class AwsFake:
    """quotas: quota code -> vCPUs; parameters: name -> value (others: not found)."""

    def __init__(self) -> None:
        self.quotas: dict[str, float] = {}
        self.parameters: dict[str, str] = {}
        self.requests: list[str] = []
        self.filed: list[dict[str, Any]] = []  # RequestServiceQuotaIncrease bodies
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0)))
                target = self.headers.get("X-Amz-Target", "")
                fake.requests.append(target)
                status, answer = fake.answer(target, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, target: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if target == "ServiceQuotasV20190624.GetServiceQuota":
            code = str(body.get("QuotaCode"))
            if body.get("ServiceCode") == "ec2" and code in self.quotas:
                return 200, quota_answer(code, self.quotas[code])
            return 400, {"__type": "NoSuchResourceException", "message": f"no quota {code}"}
        if target == "ServiceQuotasV20190624.RequestServiceQuotaIncrease":
            return self.request_increase(body)
        if target == "AmazonSSM.GetParameter":
            name = str(body.get("Name"))
            if name in self.parameters:
                return 200, parameter_answer(name, self.parameters[name])
            return 400, {"__type": "ParameterNotFound", "message": f"Parameter {name} not found."}
        return 400, {"__type": "UnknownOperationException", "message": target}

    def request_increase(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        code = str(body.get("QuotaCode"))
        if body.get("ServiceCode") != "ec2" or code not in QUOTA_NAMES:
            return 400, {"__type": "NoSuchResourceException", "message": f"no quota {code}"}
        if any(f["QuotaCode"] == code for f in self.filed):
            return 400, {
                "__type": "ResourceAlreadyExistsException",
                "message": f"a request for {code} is already open",
            }
        self.filed.append(body)
        number = len(self.filed)
        return 200, {
            "RequestedQuota": {
                "Id": f"d187537d15254312a9609aa51bbf762{number}",
                "CaseId": "",
                "ServiceCode": "ec2",
                "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                "QuotaCode": code,
                "QuotaName": QUOTA_NAMES[code],
                "DesiredValue": float(body["DesiredValue"]),
                "Status": "PENDING",
                "Created": 1765000000.0,
                "Requester": "arn:aws:iam::123456789012:user/ada",
                "QuotaArn": f"arn:aws:servicequotas:us-east-1:123456789012:ec2/{code}",
                "GlobalQuota": False,
                "Unit": "None",
            }
        }

    def __enter__(self) -> AwsFake:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
