package mlplane.flink;

import java.io.IOException;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.file.src.reader.SimpleStreamFormat;
import org.apache.flink.connector.file.src.reader.StreamFormat;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.core.fs.FSDataInputStream;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;

/** Each line of a UTF-8 text file as a row with one STRING column (the raw format's shape). */
public final class LineRowFormat extends SimpleStreamFormat<RowData> {

    private static final long serialVersionUID = 1L;
    private final TextLineInputFormat lines = new TextLineInputFormat();
    private final TypeInformation<RowData> producedType;

    public LineRowFormat(TypeInformation<RowData> producedType) {
        this.producedType = producedType;
    }

    @Override
    public StreamFormat.Reader<RowData> createReader(Configuration config, FSDataInputStream stream)
            throws IOException {
        TextLineInputFormat.Reader reader = lines.createReader(config, stream);
        return new StreamFormat.Reader<>() {
            @Override
            public RowData read() throws IOException {
                String line = reader.read();
                return line == null ? null : GenericRowData.of(StringData.fromString(line));
            }

            @Override
            public void close() throws IOException {
                reader.close();
            }
        };
    }

    @Override
    public TypeInformation<RowData> getProducedType() {
        return producedType;
    }
}
