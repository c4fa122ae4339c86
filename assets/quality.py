"""The data-quality report: great-expectations Data Docs over every validation run so far."""

from dagster import AssetKey, MaterializeResult, MetadataValue, asset

from assets.metadata import table
from resources.quality import QualityResource


@asset(
    group_name="quality",
    description="great-expectations Data Docs (HTML) with a page per validation of every suite; "
    "open the path in the metadata in a browser.",
    deps=[AssetKey(["datasets", "personalization_training"]), AssetKey("online_features")],
    kinds={"greatexpectations", "html"},
    owners=["team:data-platform"],
)
def data_quality_report(quality: QualityResource) -> MaterializeResult:
    engine = quality.get_client()
    index = engine.build_docs()
    latest = engine.latest_results()
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(index)),
            "url": MetadataValue.url(index.resolve().as_uri()),
            "suites": len(latest),
            "failing_suites": sum(not r["success"] for r in latest),
            "latest_validations": table(latest),
        }
    )


quality_assets = [data_quality_report]
