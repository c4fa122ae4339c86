package mlplane.flink;

import java.io.IOException;
import java.time.DateTimeException;
import java.time.LocalDateTime;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
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
import org.apache.flink.table.data.TimestampData;

/**
 * A row per line of a UTF-8 text file. Its columns, by name: {@code line} (STRING) the line;
 * {@code is_json_object} (BOOLEAN) whether the line is a JSON object; {@code $.key} (STRING) the
 * object's top-level field {@code key} as text, as JSON_VALUE(line, '$.key') gives it (a scalar's
 * text; NULL when missing, null, an array or an object, or when the line is no JSON object), or,
 * declared TIMESTAMP(3), that text read as an ISO-8601 instant in UTC (see {@link #instant}). The
 * line is parsed once, where a JSON_VALUE per field would parse it again each time (and the SQL
 * that reads a timestamp's text, regular expressions and a cast, once per query that uses it).
 */
public final class LineRowFormat extends SimpleStreamFormat<RowData> {

    static final String LINE = "line";
    static final String IS_JSON_OBJECT = "is_json_object";
    static final String FIELD_PREFIX = "$.";

    private static final long serialVersionUID = 1L;
    private final TextLineInputFormat lines = new TextLineInputFormat();
    // 'T' or a space, optional fractional seconds, and 'Z', a UTC offset ('+02:00', '-0530') or none
    private static final Pattern ISO_8601 =
            Pattern.compile(
                    "(\\d{4})-(\\d{2})-(\\d{2})[T ](\\d{2}):(\\d{2}):(\\d{2})(?:\\.(\\d+))?"
                            + "(Z|([+-])(\\d{2}):?(\\d{2}))?");
    private final String[] columns;
    private final boolean[] timestamps;
    private final TypeInformation<RowData> producedType;

    public LineRowFormat(List<String> columns, boolean[] timestamps, TypeInformation<RowData> producedType) {
        this.columns = columns.toArray(new String[0]);
        this.timestamps = timestamps.clone();
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
                String text = scalar ? value.asText() : null;
                if (timestamps[i]) {
                    row.setField(i, text == null ? null : instant(text));
                } else {
                    row.setField(i, text == null ? null : StringData.fromString(text));
                }
            }
        }
        return row;
    }

    /**
     * An ISO-8601 text as the UTC instant it names, as polars reads it (engines.data.ingest): 'T' or a
     * space, optional fractional seconds cut to milliseconds (Flink's time precision, so that an
     * event just before a window end never rounds up into the next window), and 'Z', a UTC offset
     * or none (UTC). Anything else is NULL (malformed): an impossible date, time or offset (February
 * 30, 24:00, +25:00) and an instant outside the years 1 to 9999 included.
     */
    static TimestampData instant(String text) {
        Matcher m = ISO_8601.matcher(text);
        if (!m.matches()) {
            return null;
        }
        String fraction = m.group(7) == null ? "" : m.group(7);
        int millis = fraction.isEmpty() ? 0 : Integer.parseInt((fraction + "00").substring(0, 3));
        try {
            LocalDateTime local =
                    LocalDateTime.of(
                            Integer.parseInt(m.group(1)),
                            Integer.parseInt(m.group(2)),
                            Integer.parseInt(m.group(3)),
                            Integer.parseInt(m.group(4)),
                            Integer.parseInt(m.group(5)),
                            Integer.parseInt(m.group(6)),
                            millis * 1_000_000);
            if (m.group(9) != null) {
                int hours = Integer.parseInt(m.group(10));
                int minutes = Integer.parseInt(m.group(11));
                if (hours > 23 || minutes > 59) {
                    return null;
                }
                int offset = (hours * 3600 + minutes * 60) * (m.group(9).equals("-") ? -1 : 1);
                local = local.minusSeconds(offset);
            }
            return local.getYear() < 1 || local.getYear() > 9999 ? null : TimestampData.fromLocalDateTime(local);
        } catch (DateTimeException impossible) {
            return null;
        }
    }

    @Override
    public TypeInformation<RowData> getProducedType() {
        return producedType;
    }
}
