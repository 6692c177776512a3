"""S3 and S3-compatible stores (s3://): settings from the AWS variables (storage.StoreSettings), and
commits through boto3's If-None-Match / If-Match writes (objectstore.ObjectStore)."""

from ..storage import ObjectPath as PATH
from ..storage import StoreSettings as SETTINGS

__all__ = ["PATH", "SETTINGS"]
