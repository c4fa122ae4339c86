"""The data-quality report: great-expectations Data Docs over every validation run so far."""

from dagster import AssetKey, MaterializeResult, MetadataValue, asset

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
    index = quality.engine().build_docs()
    return MaterializeResult(metadata={
        "path": MetadataValue.path(str(index)),
        "url": MetadataValue.url(index.resolve().as_uri()),
    })


quality_assets = [data_quality_report]
