// What a BI tool on pgJDBC (DBeaver, Metabase, Tableau) does first, against the PostgreSQL
// endpoint: connect with the key as password, list the tables through DatabaseMetaData (pgJDBC's
// own catalog queries), run a prepared statement with a bound parameter (several times: past
// prepareThreshold pgJDBC switches to a named server-side statement, binary transfer), and a
// forbidden statement. Run by tests/integration/test_pg_wire.py with the driver from the jar cache:
//   java -cp postgresql.jar PgJdbcProbe.java <url> <key> <sql> <parameter>
// Prints one line per fact, tab-separated: TABLE name, COLUMN name type, ROW values..., ERROR
// sqlstate message, AFTER value.
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;

public class PgJdbcProbe {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.setProperty("user", "jdbc");
        props.setProperty("password", args[1]);
        try (Connection conn = DriverManager.getConnection(args[0], props)) {
            DatabaseMetaData meta = conn.getMetaData();
            System.out.println("SERVER\t" + meta.getDatabaseProductName() + " " + meta.getDatabaseProductVersion());
            try (ResultSet tables = meta.getTables(null, "public", "%", null)) {
                while (tables.next()) {
                    System.out.println("TABLE\t" + tables.getString("TABLE_NAME"));
                }
            }
            for (int round = 0; round < 6; round++) {
                try (PreparedStatement statement = conn.prepareStatement(args[2])) {
                    statement.setString(1, args[3]);
                    try (ResultSet rows = statement.executeQuery()) {
                        ResultSetMetaData columns = rows.getMetaData();
                        if (round == 0) {
                            for (int i = 1; i <= columns.getColumnCount(); i++) {
                                System.out.println("COLUMN\t" + columns.getColumnLabel(i) + "\t" + columns.getColumnTypeName(i));
                            }
                        }
                        while (rows.next()) {
                            StringBuilder line = new StringBuilder("ROW");
                            for (int i = 1; i <= columns.getColumnCount(); i++) {
                                line.append('\t').append(rows.getString(i));
                            }
                            System.out.println(round == 5 ? line.toString().replace("ROW", "LAST") : line.toString());
                        }
                    }
                }
            }
            try (Statement statement = conn.createStatement()) {
                statement.execute("DROP TABLE ctr_batch");
            } catch (SQLException e) {
                System.out.println("ERROR\t" + e.getSQLState() + "\t" + e.getMessage().replace('\n', ' '));
            }
            try (Statement statement = conn.createStatement(); ResultSet rows = statement.executeQuery("SELECT 41 + 1 AS answer")) {
                rows.next();
                System.out.println("AFTER\t" + rows.getLong(1));
            }
        }
    }
}
