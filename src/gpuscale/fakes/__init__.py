"""Stateful fakes of external services, served over real HTTP for tests and demos.

:mod:`gpuscale.fakes.linode_api` fakes the Linode API v4 LKE endpoints and validates every request and response
against the official OpenAPI spec.
"""
