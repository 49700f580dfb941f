// Swagger UI on this service's own schema. Nothing leaves the origin: no validator badge
// (validatorUrl null), and the bundle is the one the package ships (fastapi-offline).
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  validatorUrl: null,
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  layout: "BaseLayout",
});
