%%% @doc What the eunit modules share: starting the kem application with
%%% some app env and stopping it again, and finding the repository's root
%%% (for files the Python tests share with these: the Lua example, the
%%% session kernels).
-module(kem_test_app).
-export([start/1, stop/1, start_with_kernels/3, stop_with_kernels/1, runaway_kernel/0, counting_kernel/0, wait_for_service/1, repo_root/0,
         distribute/1, undistribute/1]).

%% @doc Load kem, set each app env key, start it and what it needs.
-spec start([{atom(), term()}]) -> [atom()].
start(Env) ->
    ok = application:load(kem),
    [ok = application:set_env(kem, Key, Value) || {Key, Value} <- Env],
    {ok, Apps} = application:ensure_all_started(kem),
    Apps.

%% @doc Stop what start/1 started, newest first, and forget kem's env.
-spec stop([atom()]) -> ok.
stop(Apps) ->
    [application:stop(App) || App <- lists:reverse(Apps)],
    application:unload(kem),
    ok.

%% @doc start/1 with a fresh kernel directory holding Kernels (`{Name,
%% WgslSource}', each saved as Name.wgsl) as the app's `kernel_dir'; Tag
%% names the directory. Returns what stop_with_kernels/1 takes.
-spec start_with_kernels(string(), [{string(), binary()}], [{atom(), term()}]) -> {[atom()], file:filename()}.
start_with_kernels(Tag, Kernels, Env) ->
    Dir = filename:join("/tmp", Tag ++ "_" ++ os:getpid()),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    [ok = file:write_file(filename:join(Dir, Name ++ ".wgsl"), Source) || {Name, Source} <- Kernels],
    {start([{kernel_dir, Dir} | Env]), Dir}.

%% @doc Stop what start_with_kernels/3 started and remove its directory.
-spec stop_with_kernels({[atom()], file:filename()}) -> ok.
stop_with_kernels({Apps, Dir}) ->
    stop(Apps),
    file:del_dir_r(Dir),
    ok.

%% @doc A kernel that runs far past any test's timeout on any adapter:
%% 2.7e11 invocations of 50,000 atomic turns each, under gas's 60,000 turns
%% an invocation (KEM_GAS_TURNS), so only its size outruns a timeout (the faults and spare
%% tests' runaway).
-spec runaway_kernel() -> binary().
runaway_kernel() ->
    <<"
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<atomic<u32>>;
@compute @workgroup_size(64)
fn main() {
    for (var turn = 0u; turn < 50000u; turn = turn + 1u) {
        atomicAdd(&output_words[0], input_words[0] + 1u);
    }
}
">>.

%% @doc out[i] = the sum of 0..in[i] - 1: in[i] loop turns an invocation,
%% none past the data; the gas tests' kernel whose gas is counted by hand,
%% the one text pytest reads too (tests/gas_kernels/counting.wgsl).
-spec counting_kernel() -> binary().
counting_kernel() ->
    {ok, Text} = file:read_file(find_up(filename:dirname(filename:absname(code:which(?MODULE))),
                                        "tests/gas_kernels/counting.wgsl")),
    Text.

%% The repository's file Rel, found from Dir upward (the test beams sit in
%% _build, at a depth that depends on the profile and REBAR_BASE_DIR).
find_up(Dir, Rel) ->
    Path = filename:join(Dir, Rel),
    case filelib:is_regular(Path) of
        true -> Path;
        false when Dir =:= "/" -> error({not_found, Rel});
        false -> find_up(filename:dirname(Dir), Rel)
    end.

%% @doc `ok' once kem answers a ping (a port is serving again), within
%% Left ms; else `timeout'.
-spec wait_for_service(integer()) -> ok | timeout.
wait_for_service(Left) when Left =< 0 -> timeout;
wait_for_service(Left) ->
    case catch kem:ping() of  % the app may be between ports
        {ok, pong} -> ok;
        _ -> timer:sleep(50), wait_for_service(Left - 50)
    end.

%% @doc The checkout's root: the first directory above this module's beam
%% that holds examples/kem-device.lua.
-spec repo_root() -> file:filename().
repo_root() ->
    find_up(filename:dirname(code:which(?MODULE))).

find_up(Dir) ->
    case filelib:is_file(filename:join(Dir, "examples/kem-device.lua")) of
        true -> Dir;
        false when Dir =/= "/" -> find_up(filename:dirname(Dir));
        false -> error({no_repo_root_above, code:which(?MODULE)})
    end.

%% @doc Make this VM a distributed node named Prefix_<os pid> (shortnames),
%% for tests that start peers: `true' if it was started here (give it to
%% undistribute/1), `false' if the VM already was one. On a machine where
%% no epmd runs yet, `epmd -daemon' returns before epmd listens, and
%% net_kernel fails with `nodistribution' (CI's first eunit run, on a
%% fresh machine, saw it), so the start is tried for up to 5 s.
-spec distribute(string()) -> boolean().
distribute(Prefix) ->
    case node() of
        nonode@nohost ->
            _ = os:cmd("epmd -daemon"),
            ok = start_distribution(list_to_atom(Prefix ++ "_" ++ os:getpid()), 100),
            true;
        _ ->
            false
    end.

%% @doc Stop distribution if distribute/1 started it.
-spec undistribute(boolean()) -> ok.
undistribute(true) -> _ = net_kernel:stop(), ok;
undistribute(false) -> ok.

start_distribution(Name, 0) ->
    {ok, _} = net_kernel:start([Name, shortnames]),
    ok;
start_distribution(Name, Tries) ->
    case net_kernel:start([Name, shortnames]) of
        {ok, _} -> ok;
        {error, _} -> timer:sleep(50), start_distribution(Name, Tries - 1)
    end.
