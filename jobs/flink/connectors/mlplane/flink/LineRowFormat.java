package mlplane.flink;

import java.io.IOException;
import java.util.List;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.file.src.reader.SimpleStreamFormat;
import org.apache.flink.connector.file.src.reader.StreamFormat;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.core.fs.FSDataInputStream;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.DeserializationFeature;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.cfg.JsonNodeFeature;
import org.apache.flink.table.data.GenericRowData;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.data.StringData;

/**
 * A row per line of a UTF-8 text file. Its columns, by name: {@code line} (STRING) the line;
 * {@code is_json_object} (BOOLEAN) whether the line is a JSON object; {@code $.key} (STRING) the
 * object's top-level field {@code key} as text, as JSON_VALUE(line, '$.key') gives it (a scalar's
 * text; NULL when missing, null, an array or an object, or when the line is no JSON object). The
 * line is parsed once, where a JSON_VALUE per field would parse it again each time.
 */
public final class LineRowFormat extends SimpleStreamFormat<RowData> {

    static final String LINE = "line";
    static final String IS_JSON_OBJECT = "is_json_object";
    static final String FIELD_PREFIX = "$.";

    private static final long serialVersionUID = 1L;
    private final TextLineInputFormat lines = new TextLineInputFormat();
    private final String[] columns;
    private final TypeInformation<RowData> producedType;

    public LineRowFormat(List<String> columns, TypeInformation<RowData> producedType) {
        this.columns = columns.toArray(new String[0]);
        this.producedType = producedType;
    }

    @Override
    public StreamFormat.Reader<RowData> createReader(Configuration config, FSDataInputStream stream)
            throws IOException {
        TextLineInputFormat.Reader reader = lines.createReader(config, stream);
        // a number's text as JSON_VALUE gives it (2.50 stays 2.50, 1e3 is 1E+3); text after the
        // object makes the line malformed (JSON-lines readers refuse it)
        ObjectMapper json =
                new ObjectMapper()
                        .enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
                        .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
                        .configure(JsonNodeFeature.STRIP_TRAILING_BIGDECIMAL_ZEROES, false);
        boolean parse = columns.length > 1 || !columns[0].equals(LINE);
        return new StreamFormat.Reader<>() {
            @Override
            public RowData read() throws IOException {
                String line = reader.read();
                return line == null ? null : row(line, parse ? object(json, line) : null);
            }

            @Override
            public void close() throws IOException {
                reader.close();
            }
        };
    }

    private static JsonNode object(ObjectMapper json, String line) {
        try {
            JsonNode node = json.readTree(line);
            return node != null && node.isObject() ? node : null;
        } catch (IOException notJson) {
            return null;
        }
    }

    private RowData row(String line, JsonNode object) {
        GenericRowData row = new GenericRowData(columns.length);
        for (int i = 0; i < columns.length; i++) {
            String column = columns[i];
            if (column.equals(LINE)) {
                row.setField(i, StringData.fromString(line));
            } else if (column.equals(IS_JSON_OBJECT)) {
                row.setField(i, object != null);
            } else if (object != null) {
                JsonNode value = object.get(column.substring(FIELD_PREFIX.length()));
                boolean scalar = value != null && value.isValueNode() && !value.isNull();
                row.setField(i, scalar ? StringData.fromString(value.asText()) : null);
            }
        }
        return row;
    }

    @Override
    public TypeInformation<RowData> getProducedType() {
        return producedType;
    }
}
