"""The websocket transports: one pump (`pump`) and the protocols on it, Salience
(`salience`, /salience/ws) and Evergreen (`evergreen`, /evergreen/ws); the Responses
API's websocket mode (`responses`), whose frames the engine pushes (`frame_writer`);
what every websocket checks as its session opens (`opening`)."""
