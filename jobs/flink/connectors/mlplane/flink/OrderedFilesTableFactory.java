package mlplane.flink;

import java.time.Duration;
import java.util.List;
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
import org.apache.flink.table.types.logical.LogicalType;
import org.apache.flink.table.types.logical.LogicalTypeRoot;
import org.apache.flink.table.types.logical.TimestampType;

/**
 * connector 'ordered-files': a directory of text files, read a row per line (see LineRowFormat for
 * the columns) in the order the files arrived; with source.monitor-interval it keeps watching the
 * directory for new files (unbounded), without it it reads what is there (bounded). The
 * filesystem connector hands out a scan's files in no particular order (see
 * ArrivalOrderSplitAssigner).
 */
public final class OrderedFilesTableFactory implements DynamicTableSourceFactory {

    static final ConfigOption<String> PATH = ConfigOptions.key("path").stringType().noDefaultValue();
    static final ConfigOption<Duration> MONITOR_INTERVAL =
            ConfigOptions.key("source.monitor-interval").durationType().noDefaultValue();

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
        List<String> names = DataType.getFieldNames(row);
        List<DataType> types = DataType.getFieldDataTypes(row);
        for (int i = 0; i < names.size(); i++) {
            String name = names.get(i);
            LogicalType type = types.get(i).getLogicalType();
            boolean known =
                    name.equals(LineRowFormat.IS_JSON_OBJECT)
                            ? type.getTypeRoot() == LogicalTypeRoot.BOOLEAN
                            : name.equals(LineRowFormat.LINE)
                                    ? type.getTypeRoot() == LogicalTypeRoot.VARCHAR
                                    : name.startsWith(LineRowFormat.FIELD_PREFIX)
                                            && (type.getTypeRoot() == LogicalTypeRoot.VARCHAR || isTimestamp(type));
            if (!known) {
                throw new IllegalArgumentException(
                        "ordered-files: column `" + name + "` must be `line` STRING, `is_json_object` BOOLEAN"
                                + " or `$.<field>` STRING or TIMESTAMP(3)");
            }
        }
        if (names.isEmpty()) {
            throw new IllegalArgumentException("ordered-files: the table needs a physical column");
        }
        return new Source(helper.getOptions().get(PATH), helper.getOptions().get(MONITOR_INTERVAL), row);
    }

    static boolean isTimestamp(LogicalType type) {
        return type instanceof TimestampType && ((TimestampType) type).getPrecision() == 3;
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
            List<DataType> types = DataType.getFieldDataTypes(row);
            boolean[] timestamps = new boolean[types.size()];
            for (int i = 0; i < timestamps.length; i++) {
                timestamps[i] = isTimestamp(types.get(i).getLogicalType());
            }
            LineRowFormat format =
                    new LineRowFormat(DataType.getFieldNames(row), timestamps, context.createTypeInformation(row));
            FileSource.FileSourceBuilder<RowData> files =
                    FileSource.forRecordStreamFormat(format, new Path(path))
                            .setSplitAssigner(ArrivalOrderSplitAssigner::new);
            if (interval != null) {
                files.monitorContinuously(interval);
            }
            return SourceProvider.of(files.build());
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
