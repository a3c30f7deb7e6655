// Starts Swagger UI on /docs (api/routes/docs.py) from a file rather than an inline script, so
// the page runs under the API's Content-Security-Policy (script-src 'self'). Swagger UI's own
// defaults otherwise, as FastAPI sets them, and no online validator.
const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.openapiUrl,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
});
