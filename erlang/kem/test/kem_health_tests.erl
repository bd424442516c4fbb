%%% @doc Honest health from the real port: usable with its adapter named on
%%% this machine, and, with no Vulkan ICD and no EGL vendor, no adapter and
%%% wgpu's reason, while `ping' still answers `pong' (liveness only).
-module(kem_health_tests).
-include_lib("eunit/include/eunit.hrl").

-define(NO_DRIVERS, [{"VK_ICD_FILENAMES", "/nonexistent"}, {"VK_DRIVER_FILES", "/nonexistent"},
                     {"__EGL_VENDOR_LIBRARY_FILENAMES", "/nonexistent"}]).

usable_adapter_test_() ->
    {setup, fun() -> start([]) end, fun stop/1,
     {timeout, 60, fun() ->
         {ok, #{kem_port_1 := Health}} = kem:health(),
         ?assertMatch(#{usable := true, adapter := <<_, _/binary>>, os_pid := P} when is_integer(P), Health),
         Kind = maps:get(kind, Health),
         ?assert(lists:member(Kind, [<<"cpu">>, <<"gpu">>])),
         %% A CPU adapter always says why it is used; a GPU needs no reason.
         ?assertEqual(Kind =:= <<"cpu">>, is_binary(maps:get(reason, Health))),
         #{<<"health">> := Summary} = info_body(),
         ?assertMatch(#{<<"usable">> := true, <<"ports">> := #{<<"kem_port_1">> := #{<<"usable">> := true}}}, Summary),
         %% Strangers read info over HTTP: no OS pid (issue 24's third red team:
         %% a pid that changes tells a stranger when others' calls restarted a port).
         #{<<"ports">> := #{<<"kem_port_1">> := Public}} = Summary,
         ?assertNot(maps:is_key(<<"os_pid">>, Public))
     end}}.

no_vulkan_icd_test_() ->
    {setup, fun() -> start(?NO_DRIVERS) end, fun stop/1,
     {timeout, 60, fun() ->
         ?assertEqual({ok, pong}, kem:ping()),
         {ok, #{kem_port_1 := Health}} = kem:health(),
         ?assertMatch(#{usable := false, adapter := undefined, kind := <<"none">>}, Health),
         Reason = maps:get(reason, Health),
         ?assertNotEqual(nomatch, binary:match(Reason, <<"No suitable graphics adapter found">>)),
         ?assertMatch({error, {no_adapter, _}}, kem:execute(<<"double">>, <<1, 2, 3, 4>>, #{})),
         #{<<"health">> := Summary} = info_body(),
         ?assertMatch(#{<<"usable">> := false, <<"ports">> := #{<<"kem_port_1">> := #{<<"adapter">> := null}}}, Summary)
     end}}.

%% dev_kem's info, as the JSON a client reads.
info_body() ->
    {ok, #{<<"body">> := Json}} = dev_kem:info(#{}, #{}, #{}),
    {ok, Body} = kem_json:decode(Json),
    Body.

start(PortEnv) ->
    kem_test_app:start([{port_env, PortEnv}]).

stop(Apps) ->
    kem_test_app:stop(Apps).
