"""Build the AWS provider from the environment: the fleet mode or the managed node group mode (``GPUSCALE_AWS_MODE``).

Credentials follow boto3's default chain (``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, web identity, instance or pod role); keys given in ``env`` are passed to the session and
nowhere else. :data:`SECRET_ENV` names the variables a caller must scrub from anything it logs. A configured
interruption queue that does not exist is reported here, as the configuration error it is; a failure to reach SQS
is left for the first poll.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

import boto3

from gpuscale.clock import Clock
from gpuscale.errors import ProviderError
from gpuscale.providers.aws import AwsConfig, AwsProvider
from gpuscale.providers.aws_nodegroup import AwsNodeGroupProvider
from gpuscale.providers.base import Provider

SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def aws_provider_from_env(env: Mapping[str, str] | None, clock: Clock) -> Provider:
    """The AWS provider configured by ``env`` (see :meth:`AwsConfig.from_env`)."""
    env = os.environ if env is None else env
    config = AwsConfig.from_env(env)
    session = boto3.session.Session(
        aws_access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
        aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
        profile_name=env.get("AWS_PROFILE") or None,
        region_name=config.region,
    )
    if config.mode == "nodegroup":
        return AwsNodeGroupProvider(config, session=session, clock=clock)
    provider = AwsProvider(config, session=session, clock=clock)
    with contextlib.suppress(ProviderError):  # not a configuration error: the first poll_errors reports it
        provider.check_queue()
    return provider
