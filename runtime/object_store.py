"""The S3-compatible object store a lake may live on (``LAKE_ROOT=s3://bucket/prefix``): its
settings, from the standard AWS variables, and what Spark needs to read and write it (Hadoop's
S3A and the AWS SDK, the jar set ``s3``). The other clients' settings: :mod:`lake.storage`."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlparse

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

OBJECT_STORE_SCHEMES: Final = ("s3://", "s3a://")


def is_object_store(location: str) -> bool:
    return location.startswith(OBJECT_STORE_SCHEMES)


class ObjectStoreSettings(BaseSettings):
    """The S3-compatible store of an ``s3://`` lake, from the standard AWS variables (plus
    ``CTR_S3_PATH_STYLE``: bucket in the path, as most self-hosted servers want; default on
    when an endpoint is given)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    # The store's URL, e.g. http://127.0.0.1:8333 (`source run/s3/env` for the local one); an
    # http:// URL is spoken to without TLS. Unset: AWS S3 itself, over HTTPS.
    endpoint_url: str | None = Field(default=None, validation_alias="AWS_ENDPOINT_URL")
    # The access key's id every client of the store (Spark, delta-rs, pyarrow, DuckDB) is
    # given. Unset: none is given (each client falls back to its own defaults).
    access_key_id: str | None = Field(default=None, validation_alias="AWS_ACCESS_KEY_ID")
    # The access key's secret, given to the clients like the id (Spark's executors through
    # spark.executorEnv, which the UI redacts). A secret: never printed. Unset: none is given.
    secret_access_key: SecretStr | None = Field(
        default=None, validation_alias="AWS_SECRET_ACCESS_KEY"
    )
    # The store's region, given to every client.
    region: str = Field(default="us-east-1", validation_alias="AWS_REGION")
    # True: the bucket in the URL's path (as most self-hosted servers want); false: in the
    # host name (virtual-hosted style). Unset: path style when AWS_ENDPOINT_URL is set.
    path_style: bool | None = Field(default=None, validation_alias="CTR_S3_PATH_STYLE")
    # Where the lake is: Spark gets the S3 connector only for a lake on the object store.
    lake_root: str = Field(default="", validation_alias="LAKE_ROOT")

    @property
    def in_use(self) -> bool:
        return is_object_store(self.lake_root)

    @property
    def uses_path_style(self) -> bool:
        return self.path_style if self.path_style is not None else self.endpoint_url is not None

    @property
    def secure(self) -> bool:
        return self.endpoint_url is None or not self.endpoint_url.startswith("http://")

    @property
    def endpoint_host(self) -> str | None:
        """``host:port`` of the endpoint (what DuckDB and Hadoop's S3A take)."""
        return urlparse(self.endpoint_url).netloc if self.endpoint_url else None

    def secret(self) -> str | None:
        return self.secret_access_key.get_secret_value() if self.secret_access_key else None

    def environment(self) -> dict[str, str]:
        """The standard variables naming this store (what a process, an executor or delta-rs
        is given)."""
        variables = {"AWS_REGION": self.region}
        if self.endpoint_url:
            variables["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.access_key_id:
            variables["AWS_ACCESS_KEY_ID"] = self.access_key_id
        secret = self.secret()
        if secret:
            variables["AWS_SECRET_ACCESS_KEY"] = secret
        return variables


def spark_conf(s3: ObjectStoreSettings) -> dict[str, str]:
    """Spark settings reading and writing ``s3://`` (and ``s3a://``) paths through Hadoop's
    S3A at the store's endpoint. S3A takes the credentials from the driver's environment (its
    default provider chain reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``); executors, and
    the Python workers that write data files, get the same variables (``spark.executorEnv``,
    which Spark's UI redacts)."""
    conf = {
        # One path per table for every client: s3:// is S3A here, as on EMR.
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.s3a.endpoint.region": s3.region,
        "spark.hadoop.fs.s3a.path.style.access": str(s3.uses_path_style).lower(),
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(s3.secure).lower(),
    }
    if s3.endpoint_url:
        conf["spark.hadoop.fs.s3a.endpoint"] = s3.endpoint_url
    variables = s3.environment()
    if s3.path_style is not None:
        variables["CTR_S3_PATH_STYLE"] = str(s3.path_style).lower()
    for name, value in variables.items():
        conf[f"spark.executorEnv.{name}"] = value
    return conf
