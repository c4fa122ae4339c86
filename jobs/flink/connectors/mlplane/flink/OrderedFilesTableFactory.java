package mlplane.flink;

import java.time.Duration;
import java.util.Set;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.connector.file.src.FileSource;
import org.apache.flink.core.fs.Path;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.source.DynamicTableSource;
import org.apache.flink.table.connector.source.ScanTableSource;
import org.apache.flink.table.connector.source.SourceProvider;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DynamicTableSourceFactory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.logical.LogicalTypeRoot;

/**
 * connector 'ordered-files': a directory of text files watched for new ones, read a line per row
 * (one STRING column) in the order the files arrived. The filesystem connector reads the same rows
 * but hands out a scan's files in no particular order (see ArrivalOrderSplitAssigner).
 */
public final class OrderedFilesTableFactory implements DynamicTableSourceFactory {

    static final ConfigOption<String> PATH = ConfigOptions.key("path").stringType().noDefaultValue();
    static final ConfigOption<Duration> MONITOR_INTERVAL =
            ConfigOptions.key("source.monitor-interval").durationType().defaultValue(Duration.ofSeconds(1));

    @Override
    public String factoryIdentifier() {
        return "ordered-files";
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        return Set.of(PATH);
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        return Set.of(MONITOR_INTERVAL);
    }

    @Override
    public DynamicTableSource createDynamicTableSource(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        helper.validate();
        DataType row = context.getPhysicalRowDataType();
        var fields = row.getLogicalType().getChildren();
        if (fields.size() != 1 || fields.get(0).getTypeRoot() != LogicalTypeRoot.VARCHAR) {
            throw new IllegalArgumentException("ordered-files: the table needs exactly one physical STRING column (the line)");
        }
        return new Source(helper.getOptions().get(PATH), helper.getOptions().get(MONITOR_INTERVAL), row);
    }

    static final class Source implements ScanTableSource {
        private final String path;
        private final Duration interval;
        private final DataType row;

        Source(String path, Duration interval, DataType row) {
            this.path = path;
            this.interval = interval;
            this.row = row;
        }

        @Override
        public ChangelogMode getChangelogMode() {
            return ChangelogMode.insertOnly();
        }

        @Override
        public ScanRuntimeProvider getScanRuntimeProvider(ScanContext context) {
            FileSource<RowData> files =
                    FileSource.forRecordStreamFormat(
                                    new LineRowFormat(context.createTypeInformation(row)), new Path(path))
                            .monitorContinuously(interval)
                            .setSplitAssigner(ArrivalOrderSplitAssigner::new)
                            .build();
            return SourceProvider.of(files);
        }

        @Override
        public DynamicTableSource copy() {
            return new Source(path, interval, row);
        }

        @Override
        public String asSummaryString() {
            return "ordered-files(" + path + ")";
        }
    }
}
